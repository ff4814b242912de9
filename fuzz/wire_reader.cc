// Fuzz target: WireReader, the codec under every blob that crosses a process
// boundary (common/wire.h). The input is a script of getter calls (with
// their bounds) followed by the blob they read:
//   byte 0        bit 0: check and strip a CRC-32 trailer first
//   byte 1        n, the number of calls (at most kMaxOps)
//   n * 17 bytes  per call: the getter (Run's switch), then two int64
//                 (little-endian) it takes its bounds from
//   the rest      the blob
//
// Checks: no getter reads past the end or allocates more than the blob
// holds; a checked getter's value lies within its bounds; a failure always
// leaves a reason in error(); and what was read, written back with
// WireWriter, is byte for byte the prefix of the blob the reader consumed.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/wire.h"

using kvbridge::internal::Crc32;
using kvbridge::internal::WireReader;
using kvbridge::internal::WireWriter;

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

constexpr size_t kMaxOps = 64;

struct Op {
  uint8_t kind;
  int64_t a;
  int64_t b;
};
constexpr size_t kOpBytes = 17;

// Runs one getter; on success appends what it read to `mirror`.
bool Run(const Op& op, WireReader& r, WireWriter& mirror) {
  switch (op.kind % 11) {
    case 0: {
      uint8_t v;
      if (!r.U8(&v)) return false;
      mirror.U8(v);
      return true;
    }
    case 1: {
      uint32_t v;
      if (!r.U32(&v)) return false;
      mirror.U32(v);
      return true;
    }
    case 2: {
      uint64_t v;
      if (!r.U64(&v)) return false;
      mirror.U64(v);
      return true;
    }
    case 3: {
      int64_t v;
      if (!r.I64(&v)) return false;
      mirror.I64(v);
      return true;
    }
    case 4: {
      std::string s;
      if (!r.Bytes(&s)) return false;
      mirror.Bytes(s);
      return true;
    }
    case 5: {
      std::string_view s;
      if (!r.BytesView(&s)) return false;
      mirror.Bytes(s);
      return true;
    }
    case 6: {  // Int with bounds inside int's range
      const int64_t lo = std::min<int64_t>(op.a, op.b) >> 32;
      const int64_t hi = std::max<int64_t>(op.a, op.b) >> 32;
      int v = 0;
      if (!r.Int("int", &v, lo, hi)) return false;
      Check(v >= lo && v <= hi);
      mirror.I64(v);
      return true;
    }
    case 7: {
      const int64_t lo = std::min(op.a, op.b), hi = std::max(op.a, op.b);
      int64_t v = 0;
      if (!r.I64In("i64", &v, lo, hi)) return false;
      Check(v >= lo && v <= hi);
      mirror.I64(v);
      return true;
    }
    case 8: {
      const uint32_t x = static_cast<uint32_t>(op.a), y = static_cast<uint32_t>(op.b);
      const uint32_t lo = std::min(x, y), hi = std::max(x, y);
      uint32_t v = 0;
      if (!r.U32In("u32", &v, lo, hi)) return false;
      Check(v >= lo && v <= hi);
      mirror.U32(v);
      return true;
    }
    case 9: {
      const uint32_t max_len = static_cast<uint32_t>(op.a) % 4096;
      std::string s;
      if (!r.BoundedBytes("bytes", &s, max_len)) return false;
      Check(s.size() <= max_len);
      mirror.Bytes(s);
      return true;
    }
    default: {
      const size_t elem = static_cast<uint64_t>(op.a) % 64;
      const uint32_t max_count = static_cast<uint32_t>(op.b);
      uint32_t n = 0;
      if (!r.Count("count", &n, elem, max_count)) return false;
      Check(n <= max_count && (elem == 0 || n <= r.remaining() / elem));
      mirror.U32(n);
      return true;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const bool crc = (data[0] & 1) != 0;
  const size_t n = data[1];
  if (n > kMaxOps || size < 2 + n * kOpBytes) return 0;
  std::vector<Op> ops(n);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = data + 2 + i * kOpBytes;
    ops[i].kind = p[0];
    std::memcpy(&ops[i].a, p + 1, 8);
    std::memcpy(&ops[i].b, p + 9, 8);
  }
  const size_t head = 2 + n * kOpBytes;
  const std::string blob(reinterpret_cast<const char*>(data) + head, size - head);

  WireReader r(blob);
  size_t body = blob.size();
  if (crc) {
    const bool want = blob.size() >= 4 && [&] {
      uint32_t trailer;
      std::memcpy(&trailer, blob.data() + blob.size() - 4, 4);
      return Crc32(std::string_view(blob).substr(0, blob.size() - 4)) == trailer;
    }();
    Check(r.CheckCrc() == want);
    if (!want) return 0;
    body -= 4;
  }
  WireWriter mirror;
  for (const Op& op : ops) {
    Check(r.position() + r.remaining() == body);
    if (!Run(op, r, mirror)) {
      Check(!r.error().empty());
      return 0;
    }
    Check(r.error().empty());
  }
  Check(r.AtEnd() == (r.position() == body));
  Check(mirror.Finish() == blob.substr(0, r.position()));
  return 0;
}
