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

}  // namespace kvbridge::internal
