// Small binary codec for blobs that cross process boundaries (addresses,
// remote keys, control-message headers). Little-endian, length-prefixed
// strings, and an optional CRC-32 trailer so a garbled blob is detected
// instead of being trusted.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "kvbridge/status.h"

namespace kvbridge::internal {

uint32_t Crc32(std::string_view data);

class WireWriter {
 public:
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U32(uint32_t v) { Raw(&v, sizeof(v)); }
  void U64(uint64_t v) { Raw(&v, sizeof(v)); }
  void I64(int64_t v) { Raw(&v, sizeof(v)); }
  void Bytes(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    out_.append(s.data(), s.size());
  }
  // Appends a CRC-32 of everything written so far and returns the blob.
  std::string FinishWithCrc() {
    U32(Crc32(out_));
    return std::move(out_);
  }
  std::string Finish() { return std::move(out_); }

 private:
  void Raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string out_;
};

// Reads what WireWriter wrote. Every getter returns false past the end; the
// caller turns that into InvalidArgument naming the blob.
class WireReader {
 public:
  explicit WireReader(std::string_view in) : in_(in) {}
  // Checks and strips a CRC-32 trailer. False when missing or wrong.
  bool CheckCrc() {
    if (in_.size() < 4) return false;
    uint32_t want;
    std::memcpy(&want, in_.data() + in_.size() - 4, 4);
    in_.remove_suffix(4);
    return Crc32(in_) == want;
  }
  bool U8(uint8_t* v) { return Raw(v, 1); }
  bool U32(uint32_t* v) { return Raw(v, sizeof(*v)); }
  bool U64(uint64_t* v) { return Raw(v, sizeof(*v)); }
  bool I64(int64_t* v) { return Raw(v, sizeof(*v)); }
  bool Bytes(std::string* s) {
    uint32_t n;
    if (!U32(&n) || n > in_.size() - pos_) return false;
    s->assign(in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool BytesView(std::string_view* s) {
    uint32_t n;
    if (!U32(&n) || n > in_.size() - pos_) return false;
    *s = in_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  bool AtEnd() const { return pos_ == in_.size(); }
  size_t remaining() const { return in_.size() - pos_; }

 private:
  bool Raw(void* p, size_t n) {
    if (in_.size() - pos_ < n) return false;
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  std::string_view in_;
  size_t pos_ = 0;
};

}  // namespace kvbridge::internal
