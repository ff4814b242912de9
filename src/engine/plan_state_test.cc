// State slices across tp sizes (plan.h, StateSharding): each case builds the
// whole state of one slot, gives every prefill rank its shard by the
// definition (rank r of T holds [r * g / T, (r + 1) * g / T) of each
// sub-block g, in sub-block order, for each outer block), applies the runs
// PlanState plans for every (prefill, decode) pair to byte arrays, and
// compares each decode rank's slot with its shard by the same definition.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "engine/plan.h"
#include "engine/plan_test_util.h"

namespace kvbridge::internal {
namespace {

using ::kvbridge::internal::testing::MakeLayout;
using ::testing::HasSubstr;

struct Axis {
  std::vector<uint32_t> groups;  // full sub-block sizes; one entry: no sub-blocks given
  uint32_t outer = 1;
  uint64_t element = 4;  // bytes per element
  bool give_groups = true;
};

uint64_t Full(const Axis& a) { return std::accumulate(a.groups.begin(), a.groups.end(), 0ull); }

// Byte k of element i of outer block o of the whole state.
uint8_t Whole(uint64_t o, uint64_t i, uint64_t k) {
  return static_cast<uint8_t>(31 * o + 7 * i + k + 1);
}

// Rank r of T's slot, by the definition.
std::vector<uint8_t> Shard(const Axis& a, int r, int t) {
  std::vector<uint8_t> out;
  for (uint64_t o = 0; o < a.outer; ++o) {
    uint64_t first_of_group = 0;
    for (uint64_t g : a.groups) {
      for (uint64_t i = first_of_group + r * g / t; i < first_of_group + (r + 1) * g / t; ++i)
        for (uint64_t k = 0; k < a.element; ++k) out.push_back(Whole(o, i, k));
      first_of_group += g;
    }
  }
  return out;
}

RankLayout Layout(const Axis& a, int tp, int rank) {
  const uint64_t dim = Full(a) / tp;
  RankLayout l = MakeLayout({.tp_size = tp,
                             .tp_rank = rank,
                             .total_heads = 4,
                             .state_buffers = 1,
                             .state_item = a.outer * dim * a.element,
                             .state_slots = 4});
  StateSharding s;
  s.dim = static_cast<uint32_t>(dim);
  s.outer = a.outer;
  if (a.give_groups) s.groups = a.groups;
  l.state_sharding = {s};
  return l;
}

constexpr int32_t kSrcSlot = 2, kDstSlot = 1;

// Every decode rank's state buffer after every prefill rank ran its runs;
// `writes` counts how often each byte was written.
std::vector<std::vector<uint8_t>> Transfer(const Axis& a, int tp, int td,
                                           std::vector<std::vector<int>>* writes) {
  std::vector<std::vector<uint8_t>> src(tp), dst(td);
  writes->assign(td, {});
  for (int p = 0; p < tp; ++p) {
    RankLayout l = Layout(a, tp, p);
    src[p].assign(l.state[0].length, 0);
    std::vector<uint8_t> shard = Shard(a, p, tp);
    std::copy(shard.begin(), shard.end(), src[p].begin() + kSrcSlot * l.state[0].item_len);
  }
  for (int d = 0; d < td; ++d) {
    dst[d].assign(Layout(a, td, d).state[0].length, 0xEE);
    (*writes)[d].assign(dst[d].size(), 0);
  }
  for (int p = 0; p < tp; ++p) {
    for (int d = 0; d < td; ++d) {
      const int32_t s = kSrcSlot, t = kDstSlot;
      auto runs = PlanState(Layout(a, tp, p), Layout(a, td, d), {&s, 1}, {&t, 1});
      EXPECT_TRUE(runs.ok()) << runs.status().ToString();
      if (!runs.ok()) continue;
      for (const CopyRun& r : *runs) {
        for (uint64_t k = 0; k < r.length; ++k) {
          dst[d].at(r.dst_offset + k) = src[p].at(r.src_offset + k);
          ++(*writes)[d].at(r.dst_offset + k);
        }
      }
    }
  }
  return dst;
}

void ExpectEveryDecodeRankHoldsItsShard(const Axis& a, int tp, int td) {
  std::vector<std::vector<int>> writes;
  std::vector<std::vector<uint8_t>> dst = Transfer(a, tp, td, &writes);
  for (int d = 0; d < td; ++d) {
    const uint64_t item = Layout(a, td, d).state[0].item_len;
    const std::vector<uint8_t> want = Shard(a, d, td);
    ASSERT_EQ(want.size(), item);
    std::vector<uint8_t> got(dst[d].begin() + kDstSlot * item,
                             dst[d].begin() + (kDstSlot + 1) * item);
    EXPECT_EQ(got, want) << "tp " << tp << " -> " << td << ", decode rank " << d;
    for (uint64_t k = 0; k < dst[d].size(); ++k) {
      const bool in_slot = k / item == kDstSlot;
      EXPECT_EQ(writes[d][k], in_slot ? 1 : 0)
          << "byte " << k << " of decode rank " << d << " (tp " << tp << " -> " << td << ")";
      if (!in_slot) {
        EXPECT_EQ(dst[d][k], 0xEE) << "byte " << k << " outside the slot";
      }
    }
  }
}

TEST(StateSliceTest, OneAxisFansInAndOut) {
  const Axis a{.groups = {24}};
  for (auto [tp, td] : {std::pair{2, 1}, {1, 2}, {4, 2}, {2, 4}, {4, 1}, {1, 4}, {3, 2}, {2, 3}})
    ExpectEveryDecodeRankHoldsItsShard(a, tp, td);
}

// GDN's conv state: [q | k | v], each sub-block sharded on its own. One
// contiguous slice per rank would put q of rank 1 under k of rank 0.
TEST(StateSliceTest, SubBlocksAreShardedOneByOne) {
  const Axis a{.groups = {8, 8, 16}};
  for (auto [tp, td] : {std::pair{4, 2}, {2, 4}, {1, 4}, {4, 1}, {8, 2}})
    ExpectEveryDecodeRankHoldsItsShard(a, tp, td);
}

TEST(StateSliceTest, OuterBlocksAreShardedEachOnItsOwn) {
  const Axis a{.groups = {6, 12}, .outer = 3, .element = 2};
  for (auto [tp, td] : {std::pair{2, 3}, {3, 2}, {6, 1}, {1, 6}})
    ExpectEveryDecodeRankHoldsItsShard(a, tp, td);
}

TEST(StateSliceTest, SameTpMovesWholeSlots) {
  const Axis a{.groups = {8, 8}};
  const int32_t s = 2, t = 1;
  auto runs = PlanState(Layout(a, 2, 1), Layout(a, 2, 1), {&s, 1}, {&t, 1});
  ASSERT_TRUE(runs.ok()) << runs.status().ToString();
  const uint64_t item = Layout(a, 2, 1).state[0].item_len;
  EXPECT_EQ(*runs, (std::vector<CopyRun>{{BufferClass::kState, 0, 2 * item, 0, item, item}}));
  EXPECT_FALSE(SlicedStateBuffer(Layout(a, 2, 1), Layout(a, 2, 0), 0, 0));
}

TEST(StateSliceTest, ShareSelectsWholeBuffersOrSlices) {
  const Axis a{.groups = {8}};
  RankLayout p = Layout(a, 2, 0), d = Layout(a, 1, 0);
  // A second buffer, not sharded: it moves whole.
  p.state.push_back({0x900000, 64, 16});
  d.state.push_back({0x910000, 64, 16});
  p.state_sharding.push_back({});
  d.state_sharding.push_back({});
  const int32_t s = 1, t = 3;
  auto both = PlanState(p, d, {&s, 1}, {&t, 1});
  auto whole = PlanState(p, d, {&s, 1}, {&t, 1}, StateShare{.whole = true, .slices = false});
  auto slices = PlanState(p, d, {&s, 1}, {&t, 1}, StateShare{.whole = false, .slices = true});
  ASSERT_TRUE(both.ok() && whole.ok() && slices.ok());
  EXPECT_EQ(*whole, (std::vector<CopyRun>{{BufferClass::kState, 1, 16, 1, 48, 16}}));
  // Prefill rank 0 of 2 holds the first 4 of 8 elements (16 B) of buffer 0.
  EXPECT_EQ(*slices, (std::vector<CopyRun>{{BufferClass::kState, 0, 16, 0, 3 * 32, 16}}));
  EXPECT_EQ(both->size(), 2u);
}

TEST(StateSliceTest, FlowsCoverEveryPairWhoseSharesOverlap) {
  // 2 kv heads over prefill tp 4: ranks 0,1 hold head 0 and 2,3 head 1;
  // decode tp 2 reads head 0 from prefill 0 and head 1 from prefill 3, but
  // its state shares come from prefill 0,1 and 2,3.
  auto heads = ComputeFlows(4, 2, 2, false);
  auto sliced = ComputeFlows(4, 2, 2, false, /*state_sliced=*/true);
  ASSERT_TRUE(heads.ok() && sliced.ok());
  EXPECT_EQ(FlowsToDecode(*heads, 0).size(), 1u);
  EXPECT_EQ(FlowsToDecode(*sliced, 0), (std::vector<HeadSlice>{{0, 0, 0, 0, 1}, {1, 0, 0, 0, 0}}));
  EXPECT_EQ(FlowsToDecode(*sliced, 1), (std::vector<HeadSlice>{{3, 1, 0, 0, 1}, {2, 1, 0, 0, 0}}));
  // MLA: decode rank d reads prefill d % tp; its state share also needs
  // the prefill ranks whose shares overlap its own.
  auto mla = ComputeFlows(4, 2, 1, true, true);
  ASSERT_TRUE(mla.ok());
  EXPECT_EQ(FlowsToDecode(*mla, 1),
            (std::vector<HeadSlice>{{1, 1, 0, 0, 1}, {2, 1, 0, 0, 0}, {3, 1, 0, 0, 0}}));
  // Every prefill rank sends to some decode rank, none is a dummy.
  for (int p = 0; p < 4; ++p) EXPECT_FALSE(FlowsFromPrefill(*mla, p).empty()) << p;
}

// Every size pair up to 8 ranks a side: a pair has a flow exactly when it
// has a head flow or its shares overlap, once, and head flows are kept.
TEST(StateSliceTest, FlowsAreTheHeadFlowsPlusEveryOverlappingPair) {
  for (int tp = 1; tp <= 8; ++tp) {
    for (int td = 1; td <= 8; ++td) {
      for (auto [heads, mla] : {std::pair{1, true}, {2, false}, {4, false}, {8, false}}) {
        auto head = ComputeFlows(tp, td, heads, mla);
        auto all = ComputeFlows(tp, td, heads, mla, true);
        ASSERT_TRUE(head.ok() && all.ok());
        for (int p = 0; p < tp; ++p) {
          for (int d = 0; d < td; ++d) {
            // Shares [p/tp, (p+1)/tp) and [d/td, (d+1)/td) overlap.
            const bool overlap =
                double(p) / tp < double(d + 1) / td && double(d) / td < double(p + 1) / tp;
            int head_flows = 0, flows = 0, state_only = 0;
            for (const HeadSlice& f : *head)
              head_flows += f.prefill_rank == p && f.decode_rank == d;
            for (const HeadSlice& f : *all) {
              if (f.prefill_rank != p || f.decode_rank != d) continue;
              ++flows;
              state_only += f.num_heads == 0;
            }
            const std::string at = "tp " + std::to_string(tp) + " -> " + std::to_string(td) +
                                   ", heads " + std::to_string(heads) + ", p" + std::to_string(p) +
                                   " d" + std::to_string(d);
            EXPECT_EQ(flows - state_only, head_flows) << at;
            EXPECT_EQ(state_only, head_flows == 0 && overlap ? 1 : 0) << at;
          }
        }
      }
    }
  }
}

TEST(StateSliceTest, LayoutsThatCannotBeSlicedAreRefusedByName) {
  const Axis a{.groups = {8, 8}};
  RankLayout p = Layout(a, 2, 0), d = Layout(a, 1, 0);
  ASSERT_TRUE(CheckCompatible(p, d).ok()) << CheckCompatible(p, d).ToString();

  RankLayout unsharded = d;
  unsharded.state_sharding.clear();
  EXPECT_THAT(CheckCompatible(p, unsharded).ToString(),
              HasSubstr("state[0] is sharded across tp ranks on prefill only"));

  RankLayout other_groups = d;
  other_groups.state_sharding[0].groups = {4, 12};
  EXPECT_THAT(CheckCompatible(p, other_groups).ToString(), HasSubstr("state[0] sharding mismatch"));

  RankLayout bigger = d;  // 16 elements of 8 B instead of 4 B
  bigger.state[0].item_len *= 2;
  bigger.state[0].length *= 2;
  EXPECT_THAT(CheckCompatible(p, bigger).ToString(), HasSubstr("state[0] sharding mismatch"));

  RankLayout odd = Layout(a, 2, 0);
  odd.state_sharding[0].groups = {6, 10};  // 3 + 5 = 8 per rank, but 6 and 10 split
  EXPECT_TRUE(CheckLayout(odd).ok()) << CheckLayout(odd).ToString();
  odd.state_sharding[0].groups = {5, 11};
  EXPECT_THAT(CheckLayout(odd).ToString(), HasSubstr("sub-block of 5 elements does not split"));
  odd.state_sharding[0].groups = {8, 12};
  EXPECT_THAT(CheckLayout(odd).ToString(), HasSubstr("sub-blocks give this rank 10 elements"));
  RankLayout ragged = Layout(a, 2, 0);
  ragged.state_sharding[0].dim = 5;  // 32 B are not 5 elements
  EXPECT_THAT(CheckLayout(ragged).ToString(), HasSubstr("is not 1 outer block(s) of 5 elements"));
  RankLayout counted = Layout(a, 2, 0);
  counted.state_sharding.push_back({});
  EXPECT_THAT(CheckLayout(counted).ToString(), HasSubstr("state sharding for 2 buffers"));
}

}  // namespace
}  // namespace kvbridge::internal
