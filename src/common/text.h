// Text that may come from a peer: cut without splitting a UTF-8 character
// (a cut mid-character makes a log line or a JSON dump invalid), and made
// valid UTF-8 where it must be (a Python str, a strict JSON dump).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kvbridge::internal {

// The longest prefix of `text` of at most `max_bytes` bytes that does not end
// inside a UTF-8 multi-byte sequence (bytes that are not UTF-8 are cut as
// they come).
std::string_view Utf8Prefix(std::string_view text, size_t max_bytes);

// `text` with every byte that does not begin or continue a well-formed UTF-8
// character (RFC 3629: no overlong form, no surrogate, nothing past
// U+10FFFF, no cut sequence) replaced by U+FFFD; valid text comes back as is.
std::string ValidUtf8(std::string_view text);

}  // namespace kvbridge::internal
