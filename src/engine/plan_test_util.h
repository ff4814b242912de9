// Test helpers shared by plan_test.cc and plan_runs_test.cc.
#pragma once

#include <cstdint>
#include <ostream>

#include "engine/plan.h"

namespace kvbridge::internal::testing {

// The shape of one rank, in the terms a test thinks in. kv_heads and the item
// lengths are derived the way sglang derives them.
struct LayoutSpec {
  bool mla = false;
  int page_size = 2;
  int tp_size = 1;
  int tp_rank = 0;
  int total_heads = 2;
  int start_layer = 0;
  int end_layer = 2;
  uint64_t head_bytes = 4;  // bytes of one head of one token
  uint64_t pages = 8;       // page slots per kv buffer
  int aux_buffers = 1;
  uint64_t aux_item = 16;
  uint64_t aux_rows = 4;
  int state_buffers = 0;
  uint64_t state_item = 8;
  uint64_t state_slots = 4;
  const char* dtype = "bfloat16";
};

inline RankLayout MakeLayout(const LayoutSpec& s) {
  RankLayout l;
  l.is_mla = s.mla;
  l.page_size = s.page_size;
  l.dtype = s.dtype;
  l.tp_size = s.tp_size;
  l.tp_rank = s.tp_rank;
  l.total_kv_heads = s.total_heads;
  l.kv_heads = s.mla ? 1 : HeadsOfRank(s.total_heads, s.tp_size, s.tp_rank).count;
  l.start_layer = s.start_layer;
  l.end_layer = s.end_layer;
  const uint64_t item = static_cast<uint64_t>(s.page_size) * l.kv_heads * s.head_bytes;
  const int buffers = (s.end_layer - s.start_layer) * (s.mla ? 1 : 2);
  uint64_t addr = 0x10000;
  for (int i = 0; i < buffers; ++i, addr += 0x10000) l.kv.push_back({addr, s.pages * item, item});
  for (int i = 0; i < s.aux_buffers; ++i, addr += 0x10000) {
    l.aux.push_back({addr, s.aux_rows * s.aux_item, s.aux_item});
  }
  for (int i = 0; i < s.state_buffers; ++i, addr += 0x10000) {
    l.state.push_back({addr, s.state_slots * s.state_item, s.state_item});
  }
  return l;
}

}  // namespace kvbridge::internal::testing

namespace kvbridge::internal {

// Readable failures for EXPECT_EQ on slices and runs.
inline void PrintTo(const HeadSlice& s, std::ostream* os) {
  *os << "{p" << s.prefill_rank << "->d" << s.decode_rank << " src " << s.src_head << " dst "
      << s.dst_head << " n " << s.num_heads << "}";
}
inline void PrintTo(const HeadRange& h, std::ostream* os) {
  *os << "{first " << h.first << " count " << h.count << "}";
}
inline void PrintTo(const CopyRun& r, std::ostream* os) {
  *os << "{cls " << int(r.cls) << " src " << r.src_buffer << "+" << r.src_offset << " dst "
      << r.dst_buffer << "+" << r.dst_offset << " len " << r.length << "}";
}

}  // namespace kvbridge::internal
