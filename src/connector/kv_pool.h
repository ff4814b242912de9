// KvPool: KV buffers of one rank shaped like a real model, with a pattern
// that proves every byte landed where it belongs. Used by tests, the
// benchmarks and the demo.
//
// The pattern of a page depends on (room, buffer, position of the page in the
// request, token, global head), never on where the page sits in either pool
// or on how heads are split across tp ranks, so decode can verify what any
// mix of prefill ranks wrote. "buffer" is the global buffer identity (K or V
// of model layer l; MLA: layer l), not the index in this pool: a pool holding
// only a pipeline stage's layers writes the pattern a pool of every layer
// expects in the same layer, and a page landing in another layer is corrupt.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvbridge/options.h"
#include "kvbridge/status.h"

namespace kvbridge::internal {

// The layers [first, first + count) that pipeline stage `pp_rank` of
// `pp_size` holds: sglang's (and vLLM's) get_pp_indices without a custom
// partition: layers / pp_size each, the remainder one apiece to the stages
// just before the last (the last stage also runs the LM head). count is 0
// when there are fewer layers than stages; {0, 0} for out-of-range input.
struct LayerRange {
  int first = 0;
  int count = 0;

  friend bool operator==(const LayerRange&, const LayerRange&) = default;
};
LayerRange LayersOfStage(int layers, int pp_size, int pp_rank);

struct ModelShape {
  int layers = 32;
  int total_kv_heads = 8;
  int head_dim = 128;
  int dtype_bytes = 2;
  int page_size = 16;
  bool mla = false;
  int aux_item_len = 64;   // bytes per aux row (0 = no aux buffer)
  int state_item_len = 0;  // bytes per state slot (0 = no state buffer)
  // One state buffer per layer held, named by its model layer
  // (KVArgs::state_layer_ids, so stages send their own); else one buffer.
  bool state_per_layer = false;
};

struct PoolOptions {
  ModelShape shape;
  int tp_size = 1;
  int tp_rank = 0;
  // Layers [first_layer, first_layer + num_layers) of shape.layers held by
  // this pool (a pipeline stage's); num_layers -1 = up to the last layer.
  // MHA: K buffers of these layers then V buffers (sglang's order); MLA: one
  // buffer per layer.
  int first_layer = 0;
  int num_layers = -1;
  int num_pages = 1024;  // page slots per kv buffer
  int aux_rows = 64;
  int state_slots = 64;
  bool shared_memory = false;  // AllocateSharedBuffer instead of malloc
};

class KvPool {
 public:
  static Result<std::unique_ptr<KvPool>> Create(const PoolOptions& options);
  ~KvPool();

  // KVArgs for a manager over this pool (prefill_start_layer/end_layer are
  // the pool's layer range).
  KVArgs Args() const;
  int first_layer() const { return first_layer_; }
  int num_layers() const { return num_layers_; }
  int kv_heads() const { return kv_heads_; }
  int first_head() const { return first_head_; }
  uint64_t head_bytes() const;
  uint64_t page_bytes() const { return item_len_; }
  size_t num_kv_buffers() const { return kv_.size(); }
  size_t num_aux_buffers() const { return aux_.size(); }
  size_t num_state_buffers() const { return state_.size(); }
  const ModelShape& shape() const { return opts_.shape; }

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
  // Decode, under decode context parallelism: counts rows (per kv buffer)
  // that differ from the pattern among the tokens of a request of
  // `prefill_pages` pages (from its first page after decode's prefix) that
  // dcp rank `dcp_rank` of `dcp_size` holds: token p at row p / dcp_size of
  // `pages` (page row / page_size, row % page_size in it).
  uint64_t CountCorruptDcpRows(uint64_t room, std::span<const int32_t> pages, int64_t prefill_pages,
                               int dcp_size, int dcp_rank) const;
  bool AuxMatches(uint64_t room, int64_t aux_index) const;
  bool StateMatches(uint64_t room, std::span<const int32_t> state) const;
  // Overwrites pages with a filler (decode, before reuse).
  void Scrub(std::span<const int32_t> pages, uint8_t value);
  bool PagesHold(std::span<const int32_t> pages, uint8_t value) const;

 private:
  KvPool() = default;
  uint8_t* Alloc(size_t bytes);
  // The global identity of kv buffer `b` of this pool: K of layer l is l, V
  // of layer l is shape.layers + l (MLA: l). Equal to `b` when the pool holds
  // every layer.
  uint64_t GlobalBuffer(size_t b) const;
  // The identity of state buffer `b`: its model layer with state_per_layer.
  uint64_t GlobalState(size_t b) const;
  PoolOptions opts_;
  int first_layer_ = 0;
  int num_layers_ = 0;
  int kv_heads_ = 1;
  int first_head_ = 0;
  uint64_t item_len_ = 0;
  std::vector<uint8_t*> kv_, aux_, state_;
  std::vector<std::pair<uint8_t*, size_t>> allocations_;
};

}  // namespace kvbridge::internal
