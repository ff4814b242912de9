// State buffers paired by model layer (plan.h, PairStateBuffers), as sglang's
// newest utils.py pairs a state component's entries (state_layer_ids): a
// pipeline stage's buffers land in a decode that holds every layer's.
// Expected pairs and runs are written out by hand from the layouts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "engine/plan.h"
#include "engine/plan_test_util.h"

namespace kvbridge::internal {
namespace {

using ::kvbridge::internal::testing::MakeLayout;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A rank with one state buffer per entry of `ids` (8-byte slots, 4 of them).
RankLayout WithState(std::vector<int32_t> types, std::vector<int32_t> ids, int buffers) {
  RankLayout l = MakeLayout({.state_buffers = buffers});
  l.state_types = std::move(types);
  l.state_layer_ids = std::move(ids);
  return l;
}

TEST(PairStateBuffersTest, AStagesBuffersLandInDecodesBuffersOfTheirLayers) {
  const RankLayout stage = WithState({}, {2, 3}, 2);
  const RankLayout decode = WithState({}, {0, 1, 2, 3}, 4);
  Result<StatePairs> pairs = PairStateBuffers(stage, decode);
  ASSERT_TRUE(pairs.ok()) << pairs.status().ToString();
  EXPECT_THAT(pairs->dst, ElementsAre(2u, 3u));
  EXPECT_THAT(pairs->by_layer_id, ElementsAre(true, true));
  EXPECT_TRUE(CheckCompatible(stage, decode).ok()) << CheckCompatible(stage, decode).ToString();
}

TEST(PairStateBuffersTest, TypesPairByPositionAndIdsOnlyWithinTheirType) {
  // Type 0 has no ids (mamba); type 1 holds two buffers of layer 5.
  const RankLayout prefill = WithState({0, 1, 1}, {-1, 5, 5}, 3);
  // Decode's type 1 holds layers 4 and 5, two buffers each.
  const RankLayout decode = WithState({0, 1, 1, 1, 1}, {-1, 4, 4, 5, 5}, 5);
  Result<StatePairs> pairs = PairStateBuffers(prefill, decode);
  ASSERT_TRUE(pairs.ok()) << pairs.status().ToString();
  EXPECT_THAT(pairs->dst, ElementsAre(0u, 3u, 4u));
  EXPECT_THAT(pairs->by_layer_id, ElementsAre(false, true, true));
  // Decode's type 0 with ids of layer 5 is another type: no pair for type 1.
  Result<StatePairs> other = PairStateBuffers(prefill, WithState({0, 0, 1}, {5, 5, 4}, 3));
  ASSERT_FALSE(other.ok());
  EXPECT_THAT(other.status().message(),
              HasSubstr("state type 0: prefill 1, decode 2"));  // type 0 by position
}

TEST(PairStateBuffersTest, DecodeLackingALayerFailsNamingTypeLayerAndBuffer) {
  Result<StatePairs> missing =
      PairStateBuffers(WithState({}, {2, 3}, 2), WithState({}, {0, 1, 2}, 3));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("decode holds no state buffer of state type 0 for model layer 3 "
                        "(prefill state[1]): decode's state_layer_ids do not name that layer"));
  Result<StatePairs> taken = PairStateBuffers(WithState({}, {2, 2}, 2), WithState({}, {2, 3}, 2));
  ASSERT_FALSE(taken.ok());
  EXPECT_THAT(taken.status().message(),
              HasSubstr("model layer 2 (prefill state[1]): decode's state_layer_ids name earlier "
                        "prefill buffers of that layer"));
  // The compatibility check gives the same verdict (every room fails on it).
  EXPECT_THAT(CheckCompatible(WithState({}, {2, 3}, 2), WithState({}, {0, 1, 2}, 3)).message(),
              HasSubstr("model layer 3"));
}

TEST(PairStateBuffersTest, IdsOnOneSideOnlyPairByPositionOrSaySo) {
  Result<StatePairs> same = PairStateBuffers(WithState({}, {2, 3}, 2), WithState({}, {}, 2));
  ASSERT_TRUE(same.ok()) << same.status().ToString();
  EXPECT_THAT(same->dst, ElementsAre(0u, 1u));
  EXPECT_THAT(same->by_layer_id, ElementsAre(false, false));
  Result<StatePairs> more = PairStateBuffers(WithState({}, {2, 3}, 2), WithState({}, {}, 4));
  ASSERT_FALSE(more.ok());
  EXPECT_THAT(more.status().message(),
              HasSubstr("state buffer count mismatch: prefill 2, decode 4 (state_layer_ids given "
                        "by prefill only, so they pair by position)"));
  // A stage holding none of the layers decode names sends nothing of them.
  Result<StatePairs> none = PairStateBuffers(WithState({}, {}, 0), WithState({}, {0, 1}, 2));
  EXPECT_TRUE(none.ok()) << none.status().ToString();
  // Without ids on decode, a prefill without state still mismatches.
  EXPECT_FALSE(PairStateBuffers(WithState({}, {}, 0), WithState({}, {}, 2)).ok());
}

TEST(PairStateBuffersTest, LayoutsWithBadStateTypesOrIdsAreRefusedByName) {
  struct Case {
    std::vector<int32_t> types, ids;
    const char* words;
  };
  for (const Case& c : {Case{{}, {1}, "state_layer_ids has 1 entries for 2 state buffers"},
                        Case{{}, {0, -2}, "state_layer_ids[1] is -2"},
                        Case{{0, 0}, {-1, 3}, "the buffers of state type 0 have layer ids all"},
                        Case{{0, 2}, {}, "state_types[1] is 2, outside [0, 2)"},
                        Case{{0}, {}, "state_types has 1 entries for 2 state buffers"}}) {
    Status s = CheckLayout(WithState(c.types, c.ids, 2));
    EXPECT_THAT(s.message(), HasSubstr(c.words)) << s.ToString();
  }
  EXPECT_TRUE(CheckLayout(WithState({0, 1}, {-1, 3}, 2)).ok());
}

TEST(PairStateBuffersTest, PlanStateWritesEachBufferIntoItsPairAndStagesSendTheirOwn) {
  // Type 0 (no ids) and type 1 (layer 3); decode's type 1 holds layers 2, 3.
  const RankLayout prefill = WithState({0, 1}, {-1, 3}, 2);
  const RankLayout decode = WithState({0, 1, 1}, {-1, 2, 3}, 3);
  const std::vector<int32_t> src = {1, kStateSectionEnd, 2};
  const std::vector<int32_t> dst = {0, kStateSectionEnd, 3};
  Result<std::vector<CopyRun>> last = PlanState(prefill, decode, src, dst);
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_THAT(*last, ElementsAre(CopyRun{BufferClass::kState, 0, 8, 0, 0, 8},
                                 CopyRun{BufferClass::kState, 1, 16, 2, 24, 8}));
  // A stage before the last: its own layer's buffer only.
  Result<std::vector<CopyRun>> early =
      PlanState(prefill, decode, src, dst, {.whole = true, .slices = true, .last_stage = false});
  ASSERT_TRUE(early.ok()) << early.status().ToString();
  EXPECT_THAT(*early, ElementsAre(CopyRun{BufferClass::kState, 1, 16, 2, 24, 8}));
  // Without ids it sends none, and its slot list (sglang passes none there)
  // is not looked at.
  const RankLayout plain = WithState({}, {}, 1);
  const std::vector<int32_t> one = {1};
  Result<std::vector<CopyRun>> nothing =
      PlanState(plain, plain, {}, one, {.whole = true, .slices = true, .last_stage = false});
  ASSERT_TRUE(nothing.ok()) << nothing.status().ToString();
  EXPECT_TRUE(nothing->empty());
}

}  // namespace
}  // namespace kvbridge::internal
