// Cutting text that may come from a peer without splitting a UTF-8
// character (a cut mid-character makes a log line or a JSON dump invalid).
#pragma once

#include <cstddef>
#include <string_view>

namespace kvbridge::internal {

// The longest prefix of `text` of at most `max_bytes` bytes that does not end
// inside a UTF-8 multi-byte sequence (bytes that are not UTF-8 are cut as
// they come).
std::string_view Utf8Prefix(std::string_view text, size_t max_bytes);

}  // namespace kvbridge::internal
