// The error catalog: docs/errors.md, compiled into the library at build time
// (cmake/embed_text.cmake), parsed here for `kvbridge explain` and for the
// test that keeps it complete. There is one source, the Markdown file.
//
// Format: an entry is a level-2 heading whose whole text is a cause name in
// backticks ("## `peer_exited`"); it runs to the next level-1 or level-2
// heading. Its first paragraph is the one-line meaning. Other "## " headings
// (prose sections) are not entries.
//
// Thread safety: everything here is safe to call concurrently.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kvbridge/status.h"

namespace kvbridge::internal {

struct CatalogEntry {
  std::string name;     // "peer_exited"
  std::string summary;  // the first paragraph, joined into one line
  std::string text;     // the whole entry, heading included, as Markdown
};

// docs/errors.md as compiled in (generated source).
std::string_view ErrorCatalogText();

// Entries in document order. InvalidArgument naming the entry for a
// duplicate name or an entry without a summary.
Result<std::vector<CatalogEntry>> ParseErrorCatalog(std::string_view markdown);

// The compiled-in catalog, parsed once; empty if it does not parse (the unit
// test fails then).
const std::vector<CatalogEntry>& ErrorCatalog();

// The entry for `name` in ErrorCatalog(), or null.
const CatalogEntry* FindCatalogEntry(std::string_view name);

}  // namespace kvbridge::internal
