// Helpers shared by the benchmarks: sizes, clocks, memory regions, block
// patterns, and a framed pipe channel between the bench and its target
// process. Private to bench/.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvbridge/status.h"

namespace kvbridge::bench {

// "4K", "64KiB", "1M", "16MiB", "1G", "4096": binary multiples.
Result<uint64_t> ParseSize(std::string_view text);
// 4096 -> "4 KiB", 1048576 -> "1 MiB", 1000 -> "1000 B".
std::string FormatSize(uint64_t bytes);
// 761234.5 -> "761k", 1.2e6 -> "1.20M".
std::string FormatRate(double per_second);

using Clock = std::chrono::steady_clock;
inline double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Anonymous private mapping (application-allocated memory), pre-faulted and
// kept out of fork() (MADV_DONTFORK) so page faults never land inside a timed
// loop. Move-only.
class MappedRegion {
 public:
  static Result<MappedRegion> Allocate(size_t length);
  MappedRegion() = default;
  MappedRegion(MappedRegion&& other) noexcept;
  MappedRegion& operator=(MappedRegion&& other) noexcept;
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;
  ~MappedRegion();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Fills `length` bytes with a pseudo-random pattern derived from `seed`
// (never a run of zeros), so a block that was not written cannot pass
// verification by accident.
void FillPattern(uint8_t* data, size_t length, uint64_t seed);
// 64-bit hash of a byte range (verification of sampled blocks).
uint64_t HashBytes(const uint8_t* data, size_t length);

// Where block i of a run goes: slot permutations of the source and the
// destination region, so consecutive blocks are far apart (not
// cache-resident, no prefetch help). Repeated passes reuse the permutations,
// so every write to a slot carries the same bytes.
class BlockPattern {
 public:
  BlockPattern(size_t region_size, size_t block_size, uint64_t seed);
  size_t slots() const { return dst_slots_.size(); }
  size_t block_size() const { return block_size_; }
  uint64_t src_offset(uint64_t block) const {
    return src_slots_[block % src_slots_.size()] * block_size_;
  }
  uint64_t dst_offset(uint64_t block) const {
    return dst_slots_[block % dst_slots_.size()] * block_size_;
  }

 private:
  size_t block_size_;
  std::vector<uint32_t> src_slots_;
  std::vector<uint32_t> dst_slots_;
};

// Length-prefixed frames over a pair of pipe fds. Blocking; one reader and
// one writer. Errors: Unavailable (peer closed or died), Internal (I/O).
class Channel {
 public:
  Channel(int read_fd, int write_fd) : read_fd_(read_fd), write_fd_(write_fd) {}
  Channel(Channel&& other) noexcept;
  Channel& operator=(Channel&& other) noexcept;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  ~Channel();

  Status Send(std::string_view frame);
  Result<std::string> Receive();

 private:
  int read_fd_ = -1;
  int write_fd_ = -1;
};

// Little-endian u64 packing for channel commands.
void PutU64(std::string& out, uint64_t v);
// Reads the u64 at `*pos` and advances it; false when past the end.
bool GetU64(std::string_view in, size_t* pos, uint64_t* v);

}  // namespace kvbridge::bench
