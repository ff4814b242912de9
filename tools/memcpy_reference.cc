#include "tools/memcpy_reference.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <numeric>
#include <random>
#include <vector>

namespace kvbridge::tools {

double ScatteredMemcpyGbps(size_t piece, size_t bytes, int passes) {
  if (piece == 0 || bytes < piece) return 0;
  const size_t pieces = bytes / piece;
  std::unique_ptr<uint8_t[]> src(new (std::nothrow) uint8_t[pieces * piece]);
  std::unique_ptr<uint8_t[]> dst(new (std::nothrow) uint8_t[pieces * piece]);
  if (!src || !dst) return 0;
  std::memset(src.get(), 1, pieces * piece);
  std::memset(dst.get(), 2, pieces * piece);
  std::vector<size_t> from(pieces), to(pieces);
  std::iota(from.begin(), from.end(), 0);
  std::iota(to.begin(), to.end(), 0);
  std::mt19937 rng(7);
  std::shuffle(from.begin(), from.end(), rng);
  std::shuffle(to.begin(), to.end(), rng);
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

}  // namespace kvbridge::tools
