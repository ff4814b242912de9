#include "common/error_catalog.h"

#include <set>

namespace kvbridge::internal {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> Lines(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    if (nl == std::string_view::npos) {
      lines.push_back(text);
      break;
    }
    lines.push_back(text.substr(0, nl));
    text.remove_prefix(nl + 1);
  }
  return lines;
}

// "## `name`" -> name; empty for any other line.
std::string_view EntryName(std::string_view line) {
  if (line.substr(0, 3) != "## ") return {};
  std::string_view h = Trim(line.substr(3));
  if (h.size() < 3 || h.front() != '`' || h.back() != '`') return {};
  h = h.substr(1, h.size() - 2);
  for (char c : h) {
    if (!(c == '_' || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) return {};
  }
  return h;
}

bool EndsEntry(std::string_view line) {
  return line.substr(0, 2) == "# " || line.substr(0, 3) == "## ";
}

// Skips code fences when looking for headings: a "## " inside ``` is text.
bool IsFence(std::string_view line) { return Trim(line).substr(0, 3) == "```"; }

}  // namespace

Result<std::vector<CatalogEntry>> ParseErrorCatalog(std::string_view markdown) {
  std::vector<std::string_view> lines = Lines(markdown);
  std::vector<CatalogEntry> entries;
  std::set<std::string, std::less<>> seen;
  bool in_fence = false;
  CatalogEntry* cur = nullptr;
  bool summary_done = false;
  for (std::string_view line : lines) {
    if (IsFence(line)) in_fence = !in_fence;
    if (!in_fence && !IsFence(line) && EndsEntry(line)) {
      cur = nullptr;
      std::string_view name = EntryName(line);
      if (!name.empty()) {
        if (!seen.insert(std::string(name)).second) {
          return InvalidArgumentError("error catalog: duplicate entry '" + std::string(name) + "'");
        }
        entries.push_back(CatalogEntry{std::string(name), "", ""});
        cur = &entries.back();
        summary_done = false;
      }
    }
    if (cur == nullptr) continue;
    cur->text.append(line);
    cur->text.push_back('\n');
    if (summary_done) continue;
    std::string_view t = Trim(line);
    if (!EntryName(line).empty()) continue;  // the heading itself
    if (t.empty()) {
      if (!cur->summary.empty()) summary_done = true;
      continue;
    }
    if (t.front() == '#' || t.front() == '|' || IsFence(t)) {
      summary_done = true;
      continue;
    }
    if (!cur->summary.empty()) cur->summary.push_back(' ');
    cur->summary.append(t);
  }
  for (CatalogEntry& e : entries) {
    while (e.text.size() >= 2 && e.text[e.text.size() - 1] == '\n' &&
           e.text[e.text.size() - 2] == '\n') {
      e.text.pop_back();
    }
    if (e.summary.empty()) {
      return InvalidArgumentError("error catalog: entry '" + e.name +
                                  "' has no one-line meaning (a paragraph after its heading)");
    }
  }
  return entries;
}

const std::vector<CatalogEntry>& ErrorCatalog() {
  static const std::vector<CatalogEntry> catalog = [] {
    Result<std::vector<CatalogEntry>> parsed = ParseErrorCatalog(ErrorCatalogText());
    return parsed.ok() ? std::move(parsed).value() : std::vector<CatalogEntry>{};
  }();
  return catalog;
}

const CatalogEntry* FindCatalogEntry(std::string_view name) {
  for (const CatalogEntry& e : ErrorCatalog()) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

}  // namespace kvbridge::internal
