#include "common/text.h"

namespace kvbridge::internal {

std::string_view Utf8Prefix(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  size_t cut = max_bytes;
  // Back off over continuation bytes (10xxxxxx), at most three: a UTF-8
  // character is at most four bytes long.
  for (int i = 0; i < 3 && cut > 0; ++i) {
    if ((static_cast<unsigned char>(text[cut]) & 0xC0) != 0x80) break;
    --cut;
  }
  return text.substr(0, cut);
}

namespace {

// The length of the well-formed UTF-8 character at the start of `t`, or 0.
size_t CharLength(std::string_view t) {
  auto at = [&](size_t i) { return static_cast<unsigned char>(t[i]); };
  const unsigned char b = at(0);
  if (b < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte
  if (b >= 0xC2 && b <= 0xDF) {
    n = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    n = 3;
    if (b == 0xE0) lo = 0xA0;  // overlong
    if (b == 0xED) hi = 0x9F;  // surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    n = 4;
    if (b == 0xF0) lo = 0x90;  // overlong
    if (b == 0xF4) hi = 0x8F;  // past U+10FFFF
  } else {
    return 0;
  }
  if (t.size() < n || at(1) < lo || at(1) > hi) return 0;
  for (size_t i = 2; i < n; ++i)
    if ((at(i) & 0xC0) != 0x80) return 0;
  return n;
}

}  // namespace

std::string ValidUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const size_t n = CharLength(text.substr(i));
    if (n == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD, for one byte
      ++i;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

}  // namespace kvbridge::internal
