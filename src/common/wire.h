// Small binary codec for blobs that cross process boundaries (addresses,
// remote keys, control-message headers). Little-endian, length-prefixed
// strings, and an optional CRC-32 trailer so a garbled blob is detected
// instead of being trusted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

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
//
// Input from a peer is hostile: the checked getters (Int, I64In, U32In,
// BoundedBytes, Count) also return false for a value outside the bounds the
// caller gives, and the first failure of any checked getter is kept in
// error(), naming the field, the value and the bound, e.g.
// "decode_tp_size 1073741824 out of range [1, 1024]". No getter allocates
// more than the input holds.
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
    if (!U32(&n)) return false;
    if (n > in_.size() - pos_) return Short();
    s->assign(in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool BytesView(std::string_view* s) {
    uint32_t n;
    if (!U32(&n)) return false;
    if (n > in_.size() - pos_) return Short();
    *s = in_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  bool AtEnd() const { return pos_ == in_.size(); }
  size_t remaining() const { return in_.size() - pos_; }
  size_t position() const { return pos_; }

  // An int64 converted to int only when it lies in [min, max] (which must
  // lie within int's range).
  bool Int(std::string_view field, int* v, int64_t min, int64_t max);
  bool I64In(std::string_view field, int64_t* v, int64_t min, int64_t max);
  bool U32In(std::string_view field, uint32_t* v, uint32_t min, uint32_t max);
  // A length-prefixed string of at most max_len bytes.
  bool BoundedBytes(std::string_view field, std::string* s, uint32_t max_len);
  // An element count: at most max_count, and no more elements of at least
  // min_elem_bytes each than the rest of the input can hold.
  bool Count(std::string_view field, uint32_t* n, size_t min_elem_bytes, uint32_t max_count);
  // Records a failure the caller found (the first one wins); returns false.
  bool Fail(std::string why);
  // The first failure of a checked getter or Fail, or "truncated at byte N"
  // when only unchecked getters ran out of input; empty when none failed.
  std::string error() const;

 private:
  bool Short() {
    if (short_at_ == SIZE_MAX) short_at_ = pos_;
    return false;
  }
  bool Raw(void* p, size_t n) {
    if (in_.size() - pos_ < n) return Short();
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool Missing(std::string_view field);
  std::string_view in_;
  size_t pos_ = 0;
  size_t short_at_ = SIZE_MAX;  // where an unchecked getter first ran out
  std::string error_;
};

}  // namespace kvbridge::internal
