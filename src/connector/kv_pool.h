// KvPool: KV buffers of one rank shaped like a real model, with a pattern
// that proves every byte landed where it belongs. Used by tests, the
// benchmarks and the demo.
//
// The pattern of a page depends on (room, buffer, position of the page in the
// request, token, global head), never on where the page sits in either pool
// or on how heads are split across tp ranks, so decode can verify what any
// mix of prefill ranks wrote.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvbridge/options.h"
#include "kvbridge/status.h"

namespace kvbridge::internal {

struct ModelShape {
  int layers = 32;
  int total_kv_heads = 8;
  int head_dim = 128;
  int dtype_bytes = 2;
  int page_size = 16;
  bool mla = false;
  int aux_item_len = 64;   // bytes per aux row (0 = no aux buffer)
  int state_item_len = 0;  // bytes per state slot (0 = no state buffer)
};

struct PoolOptions {
  ModelShape shape;
  int tp_size = 1;
  int tp_rank = 0;
  int num_pages = 1024;  // page slots per kv buffer
  int aux_rows = 64;
  int state_slots = 64;
  bool shared_memory = false;  // AllocateSharedBuffer instead of malloc
};

class KvPool {
 public:
  static Result<std::unique_ptr<KvPool>> Create(const PoolOptions& options);
  ~KvPool();

  // KVArgs for a manager over this pool (layers [0, layers)).
  KVArgs Args() const;
  int kv_heads() const { return kv_heads_; }
  int first_head() const { return first_head_; }
  uint64_t head_bytes() const;
  uint64_t page_bytes() const { return item_len_; }
  size_t num_kv_buffers() const { return kv_.size(); }

  // Prefill: writes the pattern of request `room` into `pages` (page i of the
  // request in pages[i]), its aux row and state slots. stride > 1: only the
  // pages at positions that are a multiple of it (a benchmark's sample; the
  // other pages still move, holding whatever they held).
  void Fill(uint64_t room, std::span<const int32_t> pages, int64_t aux_index,
            std::span<const int32_t> state, int stride = 1);
  // Decode: counts pages (per kv buffer) whose bytes differ from the pattern
  // for positions [first_position, first_position + pages.size()), only
  // positions that are a multiple of `stride`.
  uint64_t CountCorruptPages(uint64_t room, std::span<const int32_t> pages,
                             int64_t first_position = 0, int stride = 1) const;
  bool AuxMatches(uint64_t room, int64_t aux_index) const;
  bool StateMatches(uint64_t room, std::span<const int32_t> state) const;
  // Overwrites pages with a filler (decode, before reuse).
  void Scrub(std::span<const int32_t> pages, uint8_t value);
  bool PagesHold(std::span<const int32_t> pages, uint8_t value) const;

 private:
  KvPool() = default;
  uint8_t* Alloc(size_t bytes);
  PoolOptions opts_;
  int kv_heads_ = 1;
  int first_head_ = 0;
  uint64_t item_len_ = 0;
  std::vector<uint8_t*> kv_, aux_, state_;
  std::vector<std::pair<uint8_t*, size_t>> allocations_;
};

}  // namespace kvbridge::internal
