#include "connector/kv_pool.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "engine/plan.h"
#include "kvbridge/memory.h"

namespace kvbridge::internal {
namespace {

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t Seed(uint64_t room, uint64_t buffer, uint64_t position) {
  return Mix(Mix(Mix(room) ^ buffer) ^ position);
}

// One head of one token in a page: the page's seed with (token, head) in
// high bits, so every run differs and a head slice matches whichever tp
// rank holds it.
uint64_t RunSeed(uint64_t page_seed, uint64_t token, uint64_t head) {
  return page_seed ^ (token << 40 | head << 24);
}

// The pattern is the 64-bit word seed + byte offset. A 512 MiB request is
// filled and checked at memory speed, so the benchmarks that use the pool
// measure the transfer, not the checking: two words per 16-byte vector, and
// the fill with streaming stores (the pool is far larger than the cache, and
// prefill's CPU does not read it back: the transfer's copy threads do, after
// the fence at the end of Fill), which skips a read of every line before it
// is written. Positions past the last whole 16 bytes go word by word.
void FillRun(uint8_t* dst, uint64_t bytes, uint64_t seed) {
  uint64_t w = 0;
#if defined(__x86_64__) && defined(__SSE2__)
  if ((reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
    __m128i v = _mm_set_epi64x(static_cast<int64_t>(seed + 8), static_cast<int64_t>(seed));
    const __m128i step = _mm_set1_epi64x(16);
    for (; (w + 2) * 8 <= bytes; w += 2) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + w * 8), v);
      v = _mm_add_epi64(v, step);
    }
  }
#endif
  for (; (w + 1) * 8 <= bytes; ++w) {
    const uint64_t v = seed + w * 8;
    std::memcpy(dst + w * 8, &v, 8);
  }
  if (bytes % 8 != 0) {
    const uint64_t v = seed + w * 8;
    std::memcpy(dst + w * 8, &v, bytes % 8);
  }
}

// Makes FillRun's streaming stores visible before the pages are handed on.
void FillFence() {
#if defined(__x86_64__) && defined(__SSE2__)
  _mm_sfence();
#endif
}

bool RunMatches(const uint8_t* src, uint64_t bytes, uint64_t seed) {
  uint64_t w = 0;
  uint64_t diff = 0;
#if defined(__x86_64__) && defined(__SSE2__)
  {
    __m128i v = _mm_set_epi64x(static_cast<int64_t>(seed + 8), static_cast<int64_t>(seed));
    const __m128i step = _mm_set1_epi64x(16);
    __m128i acc = _mm_setzero_si128();
    for (; (w + 2) * 8 <= bytes; w += 2) {
      const __m128i got = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + w * 8));
      acc = _mm_or_si128(acc, _mm_xor_si128(got, v));
      v = _mm_add_epi64(v, step);
    }
    diff = _mm_movemask_epi8(_mm_cmpeq_epi8(acc, _mm_setzero_si128())) != 0xffff;
  }
#endif
  for (; (w + 1) * 8 <= bytes; ++w) {
    uint64_t got;
    std::memcpy(&got, src + w * 8, 8);
    diff |= got ^ (seed + w * 8);
  }
  if (bytes % 8 != 0) {
    const uint64_t v = seed + w * 8;
    diff |= std::memcmp(src + w * 8, &v, bytes % 8) != 0;
  }
  return diff == 0;
}

}  // namespace

LayerRange LayersOfStage(int layers, int pp_size, int pp_rank) {
  if (layers < 0 || pp_size < 1 || pp_rank < 0 || pp_rank >= pp_size) return {};
  const int base = layers / pp_size;
  const int extra = layers % pp_size;
  // Stages [pp_size - 1 - extra, pp_size - 1) hold one more layer.
  auto count = [&](int r) { return base + (r >= pp_size - 1 - extra && r < pp_size - 1 ? 1 : 0); };
  int first = 0;
  for (int r = 0; r < pp_rank; ++r) first += count(r);
  return {first, count(pp_rank)};
}

Result<std::unique_ptr<KvPool>> KvPool::Create(const PoolOptions& o) {
  const ModelShape& s = o.shape;
  if (s.layers < 1 || s.total_kv_heads < 1 || s.head_dim < 1 || s.dtype_bytes < 1 ||
      s.page_size < 1 || o.num_pages < 1 || o.tp_size < 1 || o.tp_rank < 0 ||
      o.tp_rank >= o.tp_size)
    return InvalidArgumentError("pool shape has a non-positive size or a bad tp rank");
  const int num_layers = o.num_layers < 0 ? s.layers - o.first_layer : o.num_layers;
  if (o.first_layer < 0 || num_layers < 1 || o.first_layer + num_layers > s.layers) {
    return InvalidArgumentError("pool layers [" + std::to_string(o.first_layer) + ", " +
                                std::to_string(o.first_layer + num_layers) +
                                ") are empty or outside the model's " + std::to_string(s.layers) +
                                " layers");
  }
  std::unique_ptr<KvPool> p(new KvPool());
  p->opts_ = o;
  p->first_layer_ = o.first_layer;
  p->num_layers_ = num_layers;
  HeadRange heads = s.mla ? HeadRange{0, 1} : HeadsOfRank(s.total_kv_heads, o.tp_size, o.tp_rank);
  p->kv_heads_ = heads.count;
  p->first_head_ = heads.first;
  p->item_len_ = static_cast<uint64_t>(s.page_size) * p->kv_heads_ * s.head_dim * s.dtype_bytes;
  int buffers = s.mla ? num_layers : 2 * num_layers;
  for (int i = 0; i < buffers; ++i) {
    uint8_t* b = p->Alloc(p->item_len_ * o.num_pages);
    if (b == nullptr) return ResourceExhaustedError("cannot allocate kv buffer");
    p->kv_.push_back(b);
  }
  if (s.aux_item_len > 0) {
    uint8_t* b = p->Alloc(static_cast<size_t>(s.aux_item_len) * o.aux_rows);
    if (b == nullptr) return ResourceExhaustedError("cannot allocate aux buffer");
    p->aux_.push_back(b);
  }
  for (int i = 0; s.state_item_len > 0 && i < (s.state_per_layer ? p->num_layers_ : 1); ++i) {
    uint8_t* b = p->Alloc(static_cast<size_t>(s.state_item_len) * o.state_slots);
    if (b == nullptr) return ResourceExhaustedError("cannot allocate state buffer");
    p->state_.push_back(b);
  }
  return p;
}

uint8_t* KvPool::Alloc(size_t bytes) {
  void* mem = nullptr;
  if (opts_.shared_memory) {
    Result<void*> r = AllocateSharedBuffer(bytes);
    if (!r.ok()) return nullptr;
    mem = *r;
  } else {
    mem = std::calloc(1, bytes);
  }
  if (mem == nullptr) return nullptr;
  allocations_.emplace_back(static_cast<uint8_t*>(mem), bytes);
  // Touch every page now, as a server's allocator does when it creates the
  // pool: the first transfer into a page must not pay for the page fault.
  std::memset(mem, 0, bytes);
  return static_cast<uint8_t*>(mem);
}

KvPool::~KvPool() {
  for (auto [mem, bytes] : allocations_) {
    if (opts_.shared_memory) {
      FreeSharedBuffer(mem).IgnoreError();
    } else {
      std::free(mem);
    }
  }
}

uint64_t KvPool::GlobalBuffer(size_t b) const {
  const uint64_t n = static_cast<uint64_t>(num_layers_);
  const uint64_t half = b / n;  // 0: K (MLA: the layer's buffer), 1: V
  return half * opts_.shape.layers + first_layer_ + b % n;
}

uint64_t KvPool::GlobalState(size_t b) const {
  return opts_.shape.state_per_layer ? static_cast<uint64_t>(first_layer_) + b : b;
}

uint64_t KvPool::head_bytes() const {
  return static_cast<uint64_t>(opts_.shape.head_dim) * opts_.shape.dtype_bytes;
}

KVArgs KvPool::Args() const {
  KVArgs a;
  a.engine_rank = opts_.tp_rank;
  for (uint8_t* b : kv_) {
    a.kv_data_ptrs.push_back(reinterpret_cast<uint64_t>(b));
    a.kv_data_lens.push_back(item_len_ * opts_.num_pages);
    a.kv_item_lens.push_back(item_len_);
  }
  for (uint8_t* b : aux_) {
    a.aux_data_ptrs.push_back(reinterpret_cast<uint64_t>(b));
    a.aux_data_lens.push_back(static_cast<uint64_t>(opts_.shape.aux_item_len) * opts_.aux_rows);
    a.aux_item_lens.push_back(opts_.shape.aux_item_len);
  }
  for (uint8_t* b : state_) {
    a.state_data_ptrs.push_back(reinterpret_cast<uint64_t>(b));
    a.state_data_lens.push_back(static_cast<uint64_t>(opts_.shape.state_item_len) *
                                opts_.state_slots);
    a.state_item_lens.push_back(opts_.shape.state_item_len);
    if (opts_.shape.state_per_layer)
      a.state_layer_ids.push_back(static_cast<int32_t>(GlobalState(a.state_layer_ids.size())));
  }
  a.page_size = opts_.shape.page_size;
  a.kv_head_num = kv_heads_;
  a.total_kv_head_num = opts_.shape.total_kv_heads;
  a.prefill_start_layer = first_layer_;
  a.prefill_end_layer = first_layer_ + num_layers_;
  a.dtype = opts_.shape.dtype_bytes == 2 ? "bfloat16" : "float32";
  return a;
}

void KvPool::Fill(uint64_t room, std::span<const int32_t> pages, int64_t aux_index,
                  std::span<const int32_t> state, int stride) {
  const uint64_t hb = head_bytes();
  for (size_t b = 0; b < kv_.size(); ++b) {
    for (size_t i = 0; i < pages.size(); i += std::max(stride, 1)) {
      uint8_t* page = kv_[b] + static_cast<uint64_t>(pages[i]) * item_len_;
      const uint64_t seed = Seed(room, GlobalBuffer(b), i);
      for (int t = 0; t < opts_.shape.page_size; ++t)
        for (int h = 0; h < kv_heads_; ++h)
          FillRun(page + (static_cast<uint64_t>(t) * kv_heads_ + h) * hb, hb,
                  RunSeed(seed, t, first_head_ + h));
    }
  }
  if (aux_index >= 0)
    for (size_t b = 0; b < aux_.size(); ++b)
      FillRun(aux_[b] + aux_index * opts_.shape.aux_item_len, opts_.shape.aux_item_len,
              Seed(room, 1000 + b, 0));
  for (size_t b = 0; b < state_.size(); ++b)
    for (size_t i = 0; i < state.size(); ++i)
      FillRun(state_[b] + static_cast<uint64_t>(state[i]) * opts_.shape.state_item_len,
              opts_.shape.state_item_len, Seed(room, 2000 + GlobalState(b), i));
  FillFence();
}

uint64_t KvPool::CountCorruptPages(uint64_t room, std::span<const int32_t> pages,
                                   int64_t first_position, int stride) const {
  const uint64_t hb = head_bytes();
  stride = std::max(stride, 1);
  uint64_t corrupt = 0;
  for (size_t b = 0; b < kv_.size(); ++b) {
    for (size_t i = 0; i < pages.size(); ++i) {
      const uint64_t position = first_position + i;
      if (position % stride != 0) continue;
      const uint8_t* page = kv_[b] + static_cast<uint64_t>(pages[i]) * item_len_;
      const uint64_t seed = Seed(room, GlobalBuffer(b), position);
      bool ok = true;
      for (int t = 0; ok && t < opts_.shape.page_size; ++t)
        for (int h = 0; ok && h < kv_heads_; ++h)
          ok = RunMatches(page + (static_cast<uint64_t>(t) * kv_heads_ + h) * hb, hb,
                          RunSeed(seed, t, first_head_ + h));
      corrupt += ok ? 0 : 1;
    }
  }
  return corrupt;
}

uint64_t KvPool::CountCorruptDcpRows(uint64_t room, std::span<const int32_t> pages,
                                     int64_t prefill_pages, int dcp_size, int dcp_rank) const {
  const uint64_t hb = head_bytes();
  const uint64_t page = static_cast<uint64_t>(opts_.shape.page_size);
  const uint64_t tokens = static_cast<uint64_t>(prefill_pages) * page;
  uint64_t corrupt = 0;
  for (size_t b = 0; b < kv_.size(); ++b) {
    for (uint64_t p = static_cast<uint64_t>(dcp_rank); p < tokens; p += dcp_size) {
      const uint64_t row = p / dcp_size;
      if (row / page >= pages.size()) {
        ++corrupt;  // no page for it
        continue;
      }
      const uint8_t* at = kv_[b] + static_cast<uint64_t>(pages[row / page]) * item_len_ +
                          (row % page) * kv_heads_ * hb;
      const uint64_t seed = Seed(room, GlobalBuffer(b), p / page);
      bool ok = true;
      for (int h = 0; ok && h < kv_heads_; ++h)
        ok =
            RunMatches(at + h * hb, hb, RunSeed(seed, static_cast<int>(p % page), first_head_ + h));
      corrupt += ok ? 0 : 1;
    }
  }
  return corrupt;
}

bool KvPool::AuxMatches(uint64_t room, int64_t aux_index) const {
  for (size_t b = 0; b < aux_.size(); ++b)
    if (!RunMatches(aux_[b] + aux_index * opts_.shape.aux_item_len, opts_.shape.aux_item_len,
                    Seed(room, 1000 + b, 0)))
      return false;
  return true;
}

bool KvPool::StateMatches(uint64_t room, std::span<const int32_t> state) const {
  for (size_t b = 0; b < state_.size(); ++b)
    for (size_t i = 0; i < state.size(); ++i)
      if (!RunMatches(state_[b] + static_cast<uint64_t>(state[i]) * opts_.shape.state_item_len,
                      opts_.shape.state_item_len, Seed(room, 2000 + GlobalState(b), i)))
        return false;
  return true;
}

void KvPool::Scrub(std::span<const int32_t> pages, uint8_t value) {
  for (uint8_t* b : kv_)
    for (int32_t p : pages) std::memset(b + static_cast<uint64_t>(p) * item_len_, value, item_len_);
}

bool KvPool::PagesHold(std::span<const int32_t> pages, uint8_t value) const {
  for (uint8_t* b : kv_)
    for (int32_t p : pages) {
      const uint8_t* page = b + static_cast<uint64_t>(p) * item_len_;
      for (uint64_t i = 0; i < item_len_; ++i)
        if (page[i] != value) return false;
    }
  return true;
}

}  // namespace kvbridge::internal
