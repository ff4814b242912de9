#include "common/wire.h"

#include <fmt/format.h>

#include <array>

namespace kvbridge::internal {

uint32_t Crc32(std::string_view data) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char ch : data) crc = table[(crc ^ ch) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

bool WireReader::Fail(std::string why) {
  if (error_.empty()) error_ = std::move(why);
  return false;
}

bool WireReader::Missing(std::string_view field) {
  return Fail(fmt::format("{} missing: input ends at byte {} of {}", field, pos_, in_.size()));
}

bool WireReader::I64In(std::string_view field, int64_t* v, int64_t min, int64_t max) {
  int64_t x;
  if (!I64(&x)) return Missing(field);
  if (x < min || x > max)
    return Fail(fmt::format("{} {} out of range [{}, {}]", field, x, min, max));
  *v = x;
  return true;
}

bool WireReader::Int(std::string_view field, int* v, int64_t min, int64_t max) {
  int64_t x;
  if (!I64In(field, &x, min, max)) return false;
  *v = static_cast<int>(x);  // in range: the caller's bounds lie within int's
  return true;
}

bool WireReader::U32In(std::string_view field, uint32_t* v, uint32_t min, uint32_t max) {
  uint32_t x;
  if (!U32(&x)) return Missing(field);
  if (x < min || x > max)
    return Fail(fmt::format("{} {} out of range [{}, {}]", field, x, min, max));
  *v = x;
  return true;
}

bool WireReader::BoundedBytes(std::string_view field, std::string* s, uint32_t max_len) {
  uint32_t n;
  if (!U32(&n)) return Missing(field);
  if (n > max_len)
    return Fail(fmt::format("{} of {} bytes exceeds the limit of {}", field, n, max_len));
  if (n > remaining()) {
    return Fail(fmt::format("{} of {} bytes runs past the end ({} left)", field, n, remaining()));
  }
  s->assign(in_.data() + pos_, n);
  pos_ += n;
  return true;
}

bool WireReader::Count(std::string_view field, uint32_t* n, size_t min_elem_bytes,
                       uint32_t max_count) {
  uint32_t x;
  if (!U32(&x)) return Missing(field);
  if (x > max_count) return Fail(fmt::format("{} {} exceeds the limit of {}", field, x, max_count));
  if (min_elem_bytes > 0 && x > remaining() / min_elem_bytes) {
    return Fail(fmt::format("{} {} cannot fit in the {} bytes left", field, x, remaining()));
  }
  *n = x;
  return true;
}

std::string WireReader::error() const {
  if (!error_.empty()) return error_;
  if (short_at_ != SIZE_MAX) return fmt::format("truncated at byte {}", short_at_);
  return "";
}

}  // namespace kvbridge::internal
