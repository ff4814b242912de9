#include "tools/memcpy_reference.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

namespace kvbridge::tools {
namespace {

// Two shuffled orders of 0..n-1 (source and destination), the same ones in
// every run (seed 7): scattered pieces, as a paged allocator hands them out.
template <typename T>
std::pair<std::vector<T>, std::vector<T>> ShuffledOrders(size_t n) {
  std::vector<T> a(n), b(n);
  std::iota(a.begin(), a.end(), T{0});
  std::iota(b.begin(), b.end(), T{0});
  std::mt19937 rng(7);
  std::shuffle(a.begin(), a.end(), rng);
  std::shuffle(b.begin(), b.end(), rng);
  return {std::move(a), std::move(b)};
}

}  // namespace

double ScatteredMemcpyGbps(size_t piece, size_t bytes, int passes) {
  if (piece == 0 || bytes < piece) return 0;
  const size_t pieces = bytes / piece;
  std::unique_ptr<uint8_t[]> src(new (std::nothrow) uint8_t[pieces * piece]);
  std::unique_ptr<uint8_t[]> dst(new (std::nothrow) uint8_t[pieces * piece]);
  if (!src || !dst) return 0;
  std::memset(src.get(), 1, pieces * piece);
  std::memset(dst.get(), 2, pieces * piece);
  const auto [from, to] = ShuffledOrders<size_t>(pieces);
  double best = 0;
  for (int p = 0; p < std::max(passes, 1); ++p) {
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < pieces; ++i)
      std::memcpy(dst.get() + to[i] * piece, src.get() + from[i] * piece, piece);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, pieces * piece / s / 1e9);
  }
  return best;
}

double PlannedMemcpyGbps(internal::RankLayout prefill, internal::RankLayout decode,
                         const internal::HeadSlice& slice, size_t bytes, int passes) {
  if (prefill.kv.size() != 2 || decode.kv.size() != 2) return 0;
  const uint64_t src_item = prefill.kv[0].item_len, dst_item = decode.kv[0].item_len;
  const size_t pages = bytes / (2 * std::max<uint64_t>({src_item, dst_item, 1}));
  if (pages == 0) return 0;
  std::vector<std::unique_ptr<uint8_t[]>> mem;
  for (auto* l : {&prefill, &decode}) {
    for (internal::BufferSpan& b : l->kv) {
      mem.emplace_back(new (std::nothrow) uint8_t[pages * b.item_len]);
      if (!mem.back()) return 0;
      std::memset(mem.back().get(), l == &prefill ? 1 : 2, pages * b.item_len);
      b.addr = reinterpret_cast<uint64_t>(mem.back().get());
      b.length = pages * b.item_len;
    }
  }
  const auto [src_pages, dst_pages] = ShuffledOrders<int32_t>(pages);
  auto runs = internal::PlanKvPages(prefill, decode, slice, src_pages, dst_pages);
  if (!runs.ok()) return 0;
  uint64_t moved = 0;
  for (const internal::CopyRun& r : *runs) moved += r.length;
  double best = 0;
  for (int p = 0; p < std::max(passes, 1); ++p) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const internal::CopyRun& r : *runs) {
      std::memcpy(reinterpret_cast<uint8_t*>(decode.kv[r.dst_buffer].addr + r.dst_offset),
                  reinterpret_cast<const uint8_t*>(prefill.kv[r.src_buffer].addr + r.src_offset),
                  r.length);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, moved / s / 1e9);
  }
  return best;
}

}  // namespace kvbridge::tools
