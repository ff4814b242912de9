// Pairing kv buffers by sglang's kv_layer_ids (PairKvBuffers): the cases
// sglang's build_transfer_entry_pairs distinguishes (ids on both sides, on
// one side, on none), read from its utils.py (docs/sglang.md, "Pairing
// buffers by layer id"), and what the runs then address.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/plan.h"
#include "engine/plan_test_util.h"

namespace kvbridge::internal {
namespace {

using ::kvbridge::internal::testing::LayoutSpec;
using ::kvbridge::internal::testing::MakeLayout;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr BufferClass kKv = BufferClass::kKv;
// sglang numbers draft-model layers from here (_DRAFT_KV_LAYER_ID_BASE).
constexpr int32_t kDraft = 1'000'000;

// A layout of `spec`'s shape whose kv buffers are exactly one per id (all
// of the same item length), labelled with those ids.
RankLayout WithIds(LayoutSpec spec, const std::vector<int32_t>& ids) {
  RankLayout l = MakeLayout(spec);
  const BufferSpan first = l.kv.front();
  l.kv.clear();
  for (size_t i = 0; i < ids.size(); ++i)
    l.kv.push_back({0x100000 + i * 0x10000, first.length, first.item_len});
  l.kv_layer_ids = ids;
  return l;
}

TEST(PairKvBuffersTest, ByRangeKAndVOfAStageLandInTheSameLayersOfDecode) {
  // Prefill stage [2, 4) of MHA, decode holding [0, 4): K of 2, 3 are
  // decode's kv[2], kv[3]; V of 2, 3 are kv[6], kv[7].
  auto pairs = PairKvBuffers(MakeLayout({.start_layer = 2, .end_layer = 4}),
                             MakeLayout({.start_layer = 0, .end_layer = 4}));
  ASSERT_TRUE(pairs.ok()) << pairs.status().ToString();
  EXPECT_THAT(*pairs, ElementsAre(2, 3, 6, 7));
  pairs = PairKvBuffers(MakeLayout({.mla = true, .start_layer = 1, .end_layer = 3}),
                        MakeLayout({.mla = true, .start_layer = 0, .end_layer = 4}));
  ASSERT_TRUE(pairs.ok()) << pairs.status().ToString();
  EXPECT_THAT(*pairs, ElementsAre(1, 2));
}

TEST(PairKvBuffersTest, ByIdEachBufferTakesDecodesEarliestUnusedOfItsLayer) {
  // A hybrid model's full-attention layers 3 and 5 (K then V) on prefill;
  // decode holds layers 1, 3, 5 and a draft layer.
  const RankLayout p = WithIds({}, {3, 5, 3, 5});
  const RankLayout d = WithIds({}, {1, 3, 5, 1, 3, 5, kDraft, kDraft});
  ASSERT_TRUE(CheckLayout(p).ok()) << CheckLayout(p).ToString();
  ASSERT_TRUE(CheckLayout(d).ok()) << CheckLayout(d).ToString();
  auto pairs = PairKvBuffers(p, d);
  ASSERT_TRUE(pairs.ok()) << pairs.status().ToString();
  EXPECT_THAT(*pairs, ElementsAre(1, 2, 4, 5));
  EXPECT_TRUE(CheckCompatible(p, d).ok()) << CheckCompatible(p, d).ToString();
  // The same ids in another order on decode: pairs follow the ids.
  pairs = PairKvBuffers(p, WithIds({}, {5, 3, 5, 3}));
  ASSERT_TRUE(pairs.ok()) << pairs.status().ToString();
  EXPECT_THAT(*pairs, ElementsAre(1, 0, 3, 2));
}

TEST(PairKvBuffersTest, ALayerDecodeLacksIsRefusedNamingTheLayer) {
  const RankLayout p = WithIds({}, {3, 5, 3, 5});
  Status s = CheckCompatible(p, WithIds({}, {3, 3}));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(),
              HasSubstr("decode holds no kv buffer for model layer 5 (prefill kv[1]): decode's "
                        "kv_layer_ids do not name that layer"));
  // One K of layer 3 on decode but K and V on prefill: the second is short.
  s = CheckCompatible(p, WithIds({}, {3, 5, 5}));
  EXPECT_THAT(s.message(), HasSubstr("model layer 3 (prefill kv[2]): decode's 1 buffer(s) of "
                                     "that layer are taken by prefill's earlier ones"));
}

TEST(PairKvBuffersTest, IdsOnOneSideOnlyPairByRangeAndSaySo) {
  // Ids that match the range on prefill only: range pairing, which works.
  RankLayout p = MakeLayout({.start_layer = 2, .end_layer = 4});
  p.kv_layer_ids = {2, 3, 2, 3};
  auto pairs = PairKvBuffers(p, MakeLayout({.end_layer = 4}));
  ASSERT_TRUE(pairs.ok()) << pairs.status().ToString();
  EXPECT_THAT(*pairs, ElementsAre(2, 3, 6, 7));
  // A hybrid pool's ids on decode only: its buffers are not its range.
  const RankLayout d = WithIds({.end_layer = 4}, {1, 3, 1, 3});
  Status s = CheckCompatible(MakeLayout({.end_layer = 4}), d);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("kv_layer_ids given by decode only, so buffers pair by layer "
                                     "range: decode layout: kv buffer count 4 for 4 layers"));
}

// Ids on one side that are not that side's layer range in order (sglang's
// compressed-MLA pool lists its buffers by compression bucket): pairing by
// range would write each buffer into another layer's, so it is refused,
// naming the first buffer it would misplace.
TEST(PairKvBuffersTest, OneSidedIdsThatAreNotTheLayerRangeAreRefused) {
  // An MLA stage [3, 6) whose ratio-4 layers are 3 and 5, ratio-128 layer 4.
  RankLayout p = MakeLayout({.mla = true, .start_layer = 3, .end_layer = 6});
  p.kv_layer_ids = {3, 5, 4};
  const RankLayout d = MakeLayout({.mla = true, .start_layer = 0, .end_layer = 8});
  auto pairs = PairKvBuffers(p, d);
  ASSERT_FALSE(pairs.ok()) << "paired by range against prefill's own ids";
  EXPECT_EQ(pairs.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(pairs.status().message(),
              HasSubstr("kv_layer_ids given by prefill only, so buffers pair by layer range: "
                        "prefill kv[1] holds model layer 5 by its kv_layer_ids, but pairing by "
                        "layer range (the other side gave none) would take it for layer 4"));
  EXPECT_FALSE(CheckCompatible(p, d).ok());
  // The same on decode's side.
  RankLayout d_ids = d;
  d_ids.kv_layer_ids = {0, 1, 2, 3, 4, 5, 7, 6};
  auto back = PairKvBuffers(MakeLayout({.mla = true, .start_layer = 3, .end_layer = 6}), d_ids);
  ASSERT_FALSE(back.ok());
  EXPECT_THAT(back.status().message(), HasSubstr("decode kv[6] holds model layer 7"));
}

TEST(PairKvBuffersTest, BytesPerHeadAreComparedOnThePairsAndNameTheModelLayer) {
  RankLayout d = WithIds({}, {1, 3, 5, 1, 3, 5});
  d.kv[2].item_len *= 2;  // K of layer 5
  d.kv[2].length *= 2;
  const Status s = CheckCompatible(WithIds({}, {3, 5, 3, 5}), d);
  EXPECT_THAT(s.message(), HasSubstr("bytes per head per token mismatch for model layer 5 (kv[1]): "
                                     "prefill 4, decode 8"));
  // Decode's layer 1, which prefill does not send, may differ.
  d = WithIds({}, {1, 3, 5, 1, 3, 5});
  d.kv[0].item_len *= 2;
  d.kv[0].length *= 2;
  EXPECT_TRUE(CheckCompatible(WithIds({}, {3, 5, 3, 5}), d).ok());
}

TEST(PairKvBuffersTest, LayoutsWithIdsAreCheckedForCountAndSign) {
  RankLayout l = WithIds({}, {3, 5, 3, 5});
  l.kv_layer_ids.pop_back();
  EXPECT_THAT(CheckLayout(l).message(), HasSubstr("kv_layer_ids has 3 entries for 4 kv buffers"));
  l = WithIds({}, {3, -5, 3, 5});
  EXPECT_THAT(CheckLayout(l).message(), HasSubstr("kv_layer_ids[1] is -5: layer ids are >= 0"));
  // With ids, the buffer count is the ids' (a hybrid pool's full-attention
  // layers are fewer than its range).
  EXPECT_TRUE(CheckLayout(WithIds({.end_layer = 8}, {3, 5, 3, 5})).ok());
}

TEST(PairKvBuffersTest, RunsWriteOnlyThePairedDecodeBuffers) {
  const RankLayout p = WithIds({}, {3, 5, 3, 5});
  const RankLayout d = WithIds({}, {1, 3, 5, 1, 3, 5, kDraft, kDraft});
  const std::vector<int32_t> src = {0, 1};
  const std::vector<int32_t> dst = {4, 5};
  // Whole pages (tp 1 to tp 1): one run per buffer, pages 4 and 5 of decode
  // at 16 bytes each (page 2 x heads 2 x 4 bytes).
  auto runs = PlanKvPages(p, d, HeadSlice{0, 0, 0, 0, 2}, src, dst);
  ASSERT_TRUE(runs.ok()) << runs.status().ToString();
  EXPECT_THAT(*runs, ElementsAre(CopyRun{kKv, 0, 0, 1, 64, 32}, CopyRun{kKv, 1, 0, 2, 64, 32},
                                 CopyRun{kKv, 2, 0, 4, 64, 32}, CopyRun{kKv, 3, 0, 5, 64, 32}));
}

}  // namespace
}  // namespace kvbridge::internal
