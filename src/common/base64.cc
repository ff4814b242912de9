#include "common/base64.h"

#include <array>
#include <cstdint>

namespace kvbridge::internal {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<int8_t, 256> MakeDecodeTable() {
  std::array<int8_t, 256> table{};
  for (auto& v : table) v = -1;
  for (int i = 0; i < 64; ++i) table[static_cast<uint8_t>(kAlphabet[i])] = static_cast<int8_t>(i);
  return table;
}
constexpr std::array<int8_t, 256> kDecode = MakeDecodeTable();

}  // namespace

std::string Base64Encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    uint32_t v = (static_cast<uint8_t>(bytes[i]) << 16) |
                 (static_cast<uint8_t>(bytes[i + 1]) << 8) | static_cast<uint8_t>(bytes[i + 2]);
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(kAlphabet[(v >> 6) & 63]);
    out.push_back(kAlphabet[v & 63]);
  }
  size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t v = static_cast<uint8_t>(bytes[i]) << 16;
    if (rest == 2) v |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(rest == 2 ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

Result<std::string> Base64Decode(std::string_view text) {
  if (text.size() % 4 != 0) {
    return InvalidArgumentError("base64: length " + std::to_string(text.size()) +
                                " is not a multiple of 4");
  }
  size_t pad = 0;
  if (!text.empty() && text.back() == '=') pad = text[text.size() - 2] == '=' ? 2 : 1;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    bool last = i + 4 == text.size();
    uint32_t v = 0;
    for (size_t k = 0; k < 4; ++k) {
      size_t pos = i + k;
      char c = text[pos];
      if (last && k >= 4 - pad) {
        v <<= 6;  // '=' counts as zero bits
        continue;
      }
      int8_t d = kDecode[static_cast<uint8_t>(c)];
      if (d < 0) {
        return InvalidArgumentError("base64: invalid character at offset " + std::to_string(pos));
      }
      v = (v << 6) | static_cast<uint32_t>(d);
    }
    out.push_back(static_cast<char>((v >> 16) & 0xff));
    if (last && pad == 2) {
      if ((v & 0xffff) != 0) {
        return InvalidArgumentError("base64: non-zero padding bits at offset " +
                                    std::to_string(i + 1));
      }
      break;
    }
    out.push_back(static_cast<char>((v >> 8) & 0xff));
    if (last && pad == 1) {
      if ((v & 0xff) != 0) {
        return InvalidArgumentError("base64: non-zero padding bits at offset " +
                                    std::to_string(i + 2));
      }
      break;
    }
    out.push_back(static_cast<char>(v & 0xff));
  }
  return out;
}

}  // namespace kvbridge::internal
