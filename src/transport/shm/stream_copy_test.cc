#include "transport/shm/stream_copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace kvbridge::internal {
namespace {

// Every byte of [dst_off, dst_off + n) equals the source and nothing around
// it is touched, for lengths below, at and above the streaming threshold and
// destinations and sources at every offset within 16 bytes.
TEST(StreamCopyTest, CopiesExactlyTheRangeAtAnyAlignmentAndLength) {
  const std::vector<size_t> lengths = {0,
                                       1,
                                       63,
                                       64,
                                       kStreamCopyMinBytes - 1,
                                       kStreamCopyMinBytes,
                                       kStreamCopyMinBytes + 1,
                                       kStreamCopyMinBytes + 63,
                                       32768,
                                       32768 + 17};
  constexpr size_t kPad = 64;
  for (size_t n : lengths) {
    for (size_t dst_off = 0; dst_off < 16; dst_off += 5) {
      for (size_t src_off = 0; src_off < 16; src_off += 7) {
        std::vector<uint8_t> src(n + kPad);
        for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + n + 7);
        std::vector<uint8_t> dst(n + 2 * kPad, 0xEE);
        StreamCopy(dst.data() + kPad + dst_off, src.data() + src_off, n);
        StreamFence();
        for (size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= kPad + dst_off && i < kPad + dst_off + n;
          const uint8_t want = inside ? src[i - kPad - dst_off + src_off] : 0xEE;
          ASSERT_EQ(dst[i], want) << "n=" << n << " dst_off=" << dst_off << " src_off=" << src_off
                                  << " byte " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvbridge::internal
