#include "transport/shm/stream_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#define KVB_STREAM_COPY_SSE2 1
#endif

namespace kvbridge::internal {

void StreamCopy(void* dst, const void* src, size_t n) {
#if KVB_STREAM_COPY_SSE2
  if (n >= kStreamCopyMinBytes) {
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    // Plain head up to a 16-byte aligned destination (streaming stores
    // need one; the loads may be unaligned).
    const size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
    std::memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    // 64 bytes (one cache line) per step: four loads, then four stores, so
    // each line is written whole and leaves the write-combining buffer in
    // one piece.
    for (; n >= 64; n -= 64, d += 64, s += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
    }
    std::memcpy(d, s, n);  // tail under 64 bytes
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

void StreamFence() {
#if KVB_STREAM_COPY_SSE2
  _mm_sfence();
#endif
}

}  // namespace kvbridge::internal
