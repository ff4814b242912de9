// Head ownership, TP flows and layout checks. Copy runs: plan_runs_test.cc.
#include "engine/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "engine/plan_test_util.h"

namespace kvbridge::internal {
namespace {

using ::kvbridge::internal::testing::LayoutSpec;
using ::kvbridge::internal::testing::MakeLayout;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// ---------------------------------------------------------------- HeadsOfRank

TEST(HeadsOfRankTest, ExactValues) {
  EXPECT_EQ(HeadsOfRank(8, 1, 0), (HeadRange{0, 8}));
  EXPECT_EQ(HeadsOfRank(8, 2, 1), (HeadRange{4, 4}));
  EXPECT_EQ(HeadsOfRank(32, 8, 3), (HeadRange{12, 4}));
  EXPECT_EQ(HeadsOfRank(8, 8, 5), (HeadRange{5, 1}));
  // Replication: tp 4 over 2 heads, ranks 0,1 hold head 0 and ranks 2,3 head 1.
  EXPECT_EQ(HeadsOfRank(2, 4, 1), (HeadRange{0, 1}));
  EXPECT_EQ(HeadsOfRank(2, 4, 2), (HeadRange{1, 1}));
  EXPECT_EQ(HeadsOfRank(1, 8, 7), (HeadRange{0, 1}));
}

TEST(HeadsOfRankTest, BadInputGivesEmptyRange) {
  EXPECT_EQ(HeadsOfRank(0, 1, 0), HeadRange{});
  EXPECT_EQ(HeadsOfRank(8, 0, 0), HeadRange{});
  EXPECT_EQ(HeadsOfRank(8, 2, 2), HeadRange{});
  EXPECT_EQ(HeadsOfRank(8, 2, -1), HeadRange{});
}

TEST(HeadsOfRankTest, EveryShapePartitionsOrReplicates) {
  for (int total : {1, 2, 4, 8, 32}) {
    for (int tp = 1; tp <= 8; ++tp) {
      SCOPED_TRACE("total " + std::to_string(total) + " tp " + std::to_string(tp));
      std::vector<int> holders(total, 0);
      int next = 0;  // ranks hold ascending, contiguous heads
      for (int r = 0; r < tp; ++r) {
        const HeadRange h = HeadsOfRank(total, tp, r);
        ASSERT_GE(h.count, 1);
        ASSERT_GE(h.first, 0);
        ASSERT_LE(h.first + h.count, total);
        for (int k = 0; k < h.count; ++k) ++holders[h.first + k];
        if (tp <= total) {
          EXPECT_EQ(h.first, next);
          next = h.first + h.count;
          if (total % tp == 0) {
            EXPECT_EQ(h, (HeadRange{r * total / tp, total / tp}));
          }
        } else {
          EXPECT_EQ(h, (HeadRange{r * total / tp, 1}));
          EXPECT_GE(h.first, next);  // replicas of a head are adjacent ranks
          next = h.first;
        }
      }
      for (int head = 0; head < total; ++head) {
        if (tp <= total) {
          EXPECT_EQ(holders[head], 1) << "head " << head;
        } else {
          EXPECT_GE(holders[head], 1) << "head " << head;
          if (tp % total == 0) {
            EXPECT_EQ(holders[head], tp / total) << "head " << head;
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------- ComputeFlows

std::vector<HeadSlice> Flows(int prefill_tp, int decode_tp, int total, bool mla) {
  Result<std::vector<HeadSlice>> flows = ComputeFlows(prefill_tp, decode_tp, total, mla);
  EXPECT_TRUE(flows.ok()) << flows.status().ToString();
  return flows.ok() ? *flows : std::vector<HeadSlice>{};
}

TEST(ComputeFlowsTest, ExactMhaFlows) {
  // {prefill_rank, decode_rank, src_head, dst_head, num_heads}, 8 kv heads.
  EXPECT_THAT(Flows(2, 2, 8, false),
              ElementsAre(HeadSlice{0, 0, 0, 0, 4}, HeadSlice{1, 1, 0, 0, 4}));
  EXPECT_THAT(Flows(1, 2, 8, false),
              ElementsAre(HeadSlice{0, 0, 0, 0, 4}, HeadSlice{0, 1, 4, 0, 4}));
  EXPECT_THAT(Flows(2, 1, 8, false),
              ElementsAre(HeadSlice{0, 0, 0, 0, 4}, HeadSlice{1, 0, 0, 4, 4}));
  EXPECT_THAT(Flows(4, 2, 8, false),
              ElementsAre(HeadSlice{0, 0, 0, 0, 2}, HeadSlice{1, 0, 0, 2, 2},
                          HeadSlice{2, 1, 0, 0, 2}, HeadSlice{3, 1, 0, 2, 2}));
  // Replicated prefill (4 ranks, 2 heads): decode rank 0 takes each head
  // from candidate 0 % 2; prefill ranks 1 and 3 are dummies.
  EXPECT_THAT(Flows(4, 1, 2, false),
              ElementsAre(HeadSlice{0, 0, 0, 0, 1}, HeadSlice{2, 0, 0, 1, 1}));
  // Replicated decode: every decode rank reads the one prefill rank's head.
  EXPECT_THAT(Flows(1, 4, 2, false),
              ElementsAre(HeadSlice{0, 0, 0, 0, 1}, HeadSlice{0, 1, 0, 0, 1},
                          HeadSlice{0, 2, 1, 0, 1}, HeadSlice{0, 3, 1, 0, 1}));
  // Both replicated: decode rank d spreads over candidates by d % 2.
  EXPECT_THAT(Flows(4, 4, 1, false),
              ElementsAre(HeadSlice{0, 0, 0, 0, 1}, HeadSlice{1, 1, 0, 0, 1},
                          HeadSlice{2, 2, 0, 0, 1}, HeadSlice{3, 3, 0, 0, 1}));
}

TEST(ComputeFlowsTest, ExactMlaFlows) {
  EXPECT_THAT(Flows(2, 2, 1, true),
              ElementsAre(HeadSlice{0, 0, 0, 0, 1}, HeadSlice{1, 1, 0, 0, 1}));
  EXPECT_THAT(Flows(4, 2, 1, true),
              ElementsAre(HeadSlice{0, 0, 0, 0, 1}, HeadSlice{1, 1, 0, 0, 1}));
  EXPECT_THAT(Flows(1, 3, 1, true), ElementsAre(HeadSlice{0, 0, 0, 0, 1}, HeadSlice{0, 1, 0, 0, 1},
                                                HeadSlice{0, 2, 0, 0, 1}));
  // total_heads plays no part for MLA.
  EXPECT_EQ(Flows(2, 3, 8, true), Flows(2, 3, 1, true));
}

TEST(ComputeFlowsTest, BadShapesAreInvalidArgument) {
  for (auto [p, d, t] : std::vector<std::tuple<int, int, int>>{
           {0, 1, 1}, {1, 0, 1}, {1, 1, 0}, {-1, 2, 8}, {2, -3, 8}, {2, 2, -8}}) {
    for (bool mla : {false, true}) {
      Result<std::vector<HeadSlice>> r = ComputeFlows(p, d, t, mla);
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
      EXPECT_THAT(r.status().message(), HasSubstr("prefill_tp " + std::to_string(p)));
    }
  }
}

// ------------------------------------------------------- PrefillStagesOfDecode

TEST(PrefillStagesOfDecodeTest, DecodeOfEveryLayerReadsEveryStage) {
  EXPECT_EQ(PrefillStagesOfDecode(1, 1, 0).value(), (std::vector<int>{0}));
  EXPECT_EQ(PrefillStagesOfDecode(3, 1, 0).value(), (std::vector<int>{0, 1, 2}));
}

TEST(PrefillStagesOfDecodeTest, EqualPpIsStageToStage) {
  EXPECT_EQ(PrefillStagesOfDecode(2, 2, 0).value(), (std::vector<int>{0}));
  EXPECT_EQ(PrefillStagesOfDecode(2, 2, 1).value(), (std::vector<int>{1}));
  EXPECT_EQ(PrefillStagesOfDecode(4, 4, 3).value(), (std::vector<int>{3}));
}

TEST(PrefillStagesOfDecodeTest, OtherPairsAreFailedPreconditionNamingBoth) {
  for (auto [p, d] : std::vector<std::pair<int, int>>{{1, 2}, {2, 3}, {4, 2}, {2, 4}}) {
    for (int rank = 0; rank < d; ++rank) {
      Result<std::vector<int>> r = PrefillStagesOfDecode(p, d, rank);
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
      EXPECT_THAT(r.status().message(), HasSubstr("pp size mismatch: prefill " + std::to_string(p) +
                                                  ", decode " + std::to_string(d)));
    }
  }
}

TEST(PrefillStagesOfDecodeTest, BadShapesAreInvalidArgument) {
  for (auto [p, d, rank] : std::vector<std::tuple<int, int, int>>{
           {0, 1, 0}, {1, 0, 0}, {2, 2, 2}, {2, 2, -1}, {2, 1, 1}}) {
    Result<std::vector<int>> r = PrefillStagesOfDecode(p, d, rank);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  }
}

// ------------------------------------------------------------- LastStageRead

// A decode of pp 1 reads every stage: the last one writes its aux row and
// unpaired state, no other (one writer per row).
TEST(LastStageReadTest, ADecodeOfPpOneTakesItFromTheLastStageOnly) {
  EXPECT_FALSE(LastStageRead(0, 3, 1));
  EXPECT_FALSE(LastStageRead(1, 3, 1));
  EXPECT_TRUE(LastStageRead(2, 3, 1));
  EXPECT_TRUE(LastStageRead(0, 1, 1));
}

// A decode stage (decode pp = prefill pp) reads only its own stage, which
// then writes them: sglang's decode waits for the row on every stage.
TEST(LastStageReadTest, ADecodeStageTakesItFromTheStageItReads) {
  for (int pp = 0; pp < 4; ++pp) EXPECT_TRUE(LastStageRead(pp, 4, 4)) << pp;
}

// The prefill rank a decode rank must read `head` from: among the prefill
// ranks holding it, candidate d % count.
int ExpectedSource(int total, int prefill_tp, int decode_rank, int head) {
  std::vector<int> candidates;
  for (int p = 0; p < prefill_tp; ++p) {
    const HeadRange h = HeadsOfRank(total, prefill_tp, p);
    if (head >= h.first && head < h.first + h.count) candidates.push_back(p);
  }
  return candidates.empty() ? -1 : candidates[decode_rank % candidates.size()];
}

TEST(ComputeFlowsTest, EveryCombinationUpToTp8) {
  for (bool mla : {false, true}) {
    for (int total : {1, 2, 4, 8}) {
      for (int ptp = 1; ptp <= 8; ++ptp) {
        for (int dtp = 1; dtp <= 8; ++dtp) {
          SCOPED_TRACE(std::string(mla ? "MLA" : "MHA") + " heads " + std::to_string(total) +
                       " tp " + std::to_string(ptp) + "->" + std::to_string(dtp));
          const std::vector<HeadSlice> flows = Flows(ptp, dtp, total, mla);
          size_t from_decode = 0;
          for (int d = 0; d < dtp; ++d) {
            const std::vector<HeadSlice> into = FlowsToDecode(flows, d);
            from_decode += into.size();
            const HeadRange dh = mla ? HeadRange{0, 1} : HeadsOfRank(total, dtp, d);
            std::vector<int> covered(dh.count, 0);
            for (size_t i = 0; i < into.size(); ++i) {
              const HeadSlice& f = into[i];
              ASSERT_GE(f.prefill_rank, 0);
              ASSERT_LT(f.prefill_rank, ptp);
              const HeadRange ph = mla ? HeadRange{0, 1} : HeadsOfRank(total, ptp, f.prefill_rank);
              ASSERT_GE(f.num_heads, 1);
              ASSERT_GE(f.src_head, 0);
              ASSERT_LE(f.src_head + f.num_heads, ph.count);
              ASSERT_GE(f.dst_head, 0);
              ASSERT_LE(f.dst_head + f.num_heads, dh.count);
              for (int k = 0; k < f.num_heads; ++k) {
                ++covered[f.dst_head + k];
                const int head = dh.first + f.dst_head + k;
                EXPECT_EQ(ph.first + f.src_head + k, head);  // same model head both sides
                if (mla) {
                  EXPECT_EQ(f.prefill_rank, d % ptp);
                } else {
                  EXPECT_EQ(f.prefill_rank, ExpectedSource(total, ptp, d, head));
                }
              }
              // Slices are ordered by destination head and maximal: a slice
              // never continues the previous one from the same prefill rank.
              if (i > 0) {
                const HeadSlice& prev = into[i - 1];
                EXPECT_LT(prev.dst_head, f.dst_head);
                EXPECT_FALSE(prev.prefill_rank == f.prefill_rank &&
                             prev.src_head + prev.num_heads == f.src_head &&
                             prev.dst_head + prev.num_heads == f.dst_head);
              }
            }
            for (int k = 0; k < dh.count; ++k) EXPECT_EQ(covered[k], 1) << "decode head " << k;
          }
          EXPECT_EQ(from_decode, flows.size());

          size_t from_prefill = 0;
          for (int p = 0; p < ptp; ++p) {
            const std::vector<HeadSlice> out = FlowsFromPrefill(flows, p);
            from_prefill += out.size();
            for (const HeadSlice& f : out) EXPECT_EQ(f.prefill_rank, p);
            const bool dummy = out.empty();
            if (mla) {
              EXPECT_EQ(dummy, p >= dtp) << "prefill rank " << p;
            } else if (ptp <= total) {
              EXPECT_FALSE(dummy) << "prefill rank " << p;  // its heads are needed
            }
          }
          EXPECT_EQ(from_prefill, flows.size());
        }
      }
    }
  }
}

TEST(ComputeFlowsTest, FiltersOnUnknownRanksAreEmpty) {
  const std::vector<HeadSlice> flows = Flows(2, 2, 8, false);
  EXPECT_THAT(FlowsToDecode(flows, 2), IsEmpty());
  EXPECT_THAT(FlowsFromPrefill(flows, -1), IsEmpty());
}

// ------------------------------------------------------- CheckLayout

struct LayoutCase {
  const char* name;
  std::function<void(RankLayout&)> mutate;
  const char* message;  // expected substring
};

class LayoutCheckTest : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(LayoutCheckTest, NamesFieldAndValue) {
  RankLayout l = MakeLayout({.tp_size = 2, .tp_rank = 1, .total_heads = 4, .state_buffers = 1});
  ASSERT_TRUE(CheckLayout(l).ok()) << CheckLayout(l).ToString();
  GetParam().mutate(l);
  const Status s = CheckLayout(l);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Fields, LayoutCheckTest,
    ::testing::Values(
        LayoutCase{"page_size", [](RankLayout& l) { l.page_size = 0; }, "page_size 0 < 1"},
        LayoutCase{"tp_size", [](RankLayout& l) { l.tp_size = 0; }, "tp_size 0 < 1"},
        LayoutCase{"tp_rank_high", [](RankLayout& l) { l.tp_rank = 2; },
                   "tp_rank 2 out of range [0, 2)"},
        LayoutCase{"tp_rank_negative", [](RankLayout& l) { l.tp_rank = -1; },
                   "tp_rank -1 out of range [0, 2)"},
        LayoutCase{"total_kv_heads", [](RankLayout& l) { l.total_kv_heads = 0; },
                   "total_kv_heads 0 < 1"},
        LayoutCase{"start_layer", [](RankLayout& l) { l.start_layer = -1; }, "start_layer -1 < 0"},
        LayoutCase{"empty_layers", [](RankLayout& l) { l.end_layer = 0; },
                   "layer range [0, 0) is empty"},
        LayoutCase{"kv_heads", [](RankLayout& l) { l.kv_heads = 4; },
                   "kv_heads 4 for tp rank 1 of 2 with 4 total kv heads, expected 2"},
        LayoutCase{"mla_kv_heads", [](RankLayout& l) { l.is_mla = true; },
                   "kv_heads 2 for MLA, expected 1"},
        LayoutCase{"kv_count", [](RankLayout& l) { l.kv.pop_back(); },
                   "kv buffer count 3 for 2 layers [0, 2) (MHA K and V), expected 4"},
        LayoutCase{"kv_item_zero", [](RankLayout& l) { l.kv[2].item_len = 0; }, "kv[2] item_len 0"},
        LayoutCase{"kv_item_divisible", [](RankLayout& l) { l.kv[1].item_len = 18; },
                   "kv[1] item_len 18 not divisible by page_size 2 * kv_heads 2"},
        LayoutCase{"kv_short", [](RankLayout& l) { l.kv[3].length = 15; },
                   "kv[3] length 15 shorter than one item of 16 bytes"},
        LayoutCase{"aux_item_zero", [](RankLayout& l) { l.aux[0].item_len = 0; },
                   "aux[0] item_len 0"},
        LayoutCase{"state_short", [](RankLayout& l) { l.state[0].length = 7; },
                   "state[0] length 7 shorter than one item of 8 bytes"}),
    [](const ::testing::TestParamInfo<LayoutCase>& info) { return info.param.name; });

TEST(LayoutCheckTest, ValidShapes) {
  EXPECT_TRUE(CheckLayout(MakeLayout({})).ok());
  EXPECT_TRUE(CheckLayout(MakeLayout({.mla = true, .tp_size = 4, .tp_rank = 3})).ok());
  EXPECT_TRUE(CheckLayout(MakeLayout({.tp_size = 8, .tp_rank = 7, .total_heads = 2})).ok());
  EXPECT_TRUE(CheckLayout(MakeLayout({.start_layer = 4, .end_layer = 8})).ok());
  EXPECT_TRUE(CheckLayout(MakeLayout({.aux_buffers = 0})).ok());
}

// ---------------------------------------------------------------- CheckCompatible

struct CompatCase {
  const char* name;
  LayoutSpec prefill;
  LayoutSpec decode;
  std::function<void(RankLayout&, RankLayout&)> mutate;
  const char* message;  // expected substring; "" means compatible
};

class LayoutCompatTest : public ::testing::TestWithParam<CompatCase> {};

TEST_P(LayoutCompatTest, Check) {
  const CompatCase& c = GetParam();
  RankLayout p = MakeLayout(c.prefill);
  RankLayout d = MakeLayout(c.decode);
  if (c.mutate) c.mutate(p, d);
  const Status s = CheckCompatible(p, d);
  if (std::string(c.message).empty()) {
    EXPECT_TRUE(s.ok()) << s.ToString();
  } else {
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr(c.message));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fields, LayoutCompatTest,
    ::testing::Values(
        CompatCase{"same", {}, {}, nullptr, ""},
        CompatCase{"tp_1_to_2",
                   {.total_heads = 4},
                   {.tp_size = 2, .tp_rank = 1, .total_heads = 4},
                   nullptr,
                   ""},
        CompatCase{"pp_stage", {.start_layer = 2, .end_layer = 4}, {.end_layer = 4}, nullptr, ""},
        CompatCase{"mla", {.mla = true}, {.mla = true, .tp_size = 2, .tp_rank = 1}, nullptr, ""},
        CompatCase{
            "is_mla", {.mla = true}, {}, nullptr, "is_mla mismatch: prefill true, decode false"},
        CompatCase{"page_size",
                   {.page_size = 16},
                   {.page_size = 32},
                   nullptr,
                   "page size mismatch: prefill 16, decode 32"},
        CompatCase{"dtype",
                   {.dtype = "bfloat16"},
                   {.dtype = "fp8_e4m3"},
                   nullptr,
                   "dtype mismatch: prefill 'bfloat16', decode 'fp8_e4m3'"},
        CompatCase{"total_heads",
                   {.total_heads = 8},
                   {.total_heads = 4},
                   nullptr,
                   "total kv heads mismatch: prefill 8, decode 4"},
        CompatCase{"decode_misses_layers",
                   {.end_layer = 4},
                   {.end_layer = 2},
                   nullptr,
                   "layer range mismatch: prefill [0, 4), decode [0, 2)"},
        CompatCase{"decode_starts_late",
                   {.start_layer = 0, .end_layer = 2},
                   {.start_layer = 1, .end_layer = 3},
                   nullptr,
                   "layer range mismatch: prefill [0, 2), decode [1, 3)"},
        CompatCase{"head_bytes",
                   {.head_bytes = 4},
                   {.head_bytes = 8},
                   nullptr,
                   "bytes per head per token mismatch for layer 0 (K): prefill 4, decode 8"},
        CompatCase{"head_bytes_v_pp",
                   {.start_layer = 1, .end_layer = 2},
                   {.end_layer = 2},
                   [](RankLayout&, RankLayout& d) {
                     d.kv[3].item_len = 32;  // V of layer 1
                     d.kv[3].length = 8 * 32;
                   },
                   "bytes per head per token mismatch for layer 1 (V): prefill 4, decode 8"},
        CompatCase{"aux_count",
                   {.aux_buffers = 2},
                   {.aux_buffers = 1},
                   nullptr,
                   "aux buffer count mismatch: prefill 2, decode 1"},
        CompatCase{"aux_item",
                   {.aux_item = 16},
                   {.aux_item = 32},
                   nullptr,
                   "aux[0] item_len mismatch: prefill 16, decode 32"},
        CompatCase{"state_count",
                   {.state_buffers = 1},
                   {.state_buffers = 0},
                   nullptr,
                   "state buffer count mismatch: prefill 1, decode 0"},
        CompatCase{"state_item",
                   {.state_buffers = 1, .state_item = 8},
                   {.state_buffers = 1, .state_item = 16},
                   nullptr,
                   "state[0] item_len mismatch: prefill 8, decode 16"},
        CompatCase{"bad_prefill", {.page_size = 0}, {}, nullptr, "prefill layout: page_size 0"},
        CompatCase{"bad_decode",
                   {},
                   {.tp_size = 2, .tp_rank = 2},
                   nullptr,
                   "decode layout: tp_rank 2 out of range [0, 2)"}),
    [](const ::testing::TestParamInfo<CompatCase>& info) { return info.param.name; });

}  // namespace
}  // namespace kvbridge::internal
