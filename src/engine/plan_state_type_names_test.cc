// State types paired by name and occurrence (plan.h, PairStateBuffers), as
// sglang's newest utils.py pairs state components (its StateType and the
// how-many-th of that type): a component without buffers is left out of
// sglang's KVArgs, so a pipeline stage may hold fewer than decode, in
// another position. Expected pairs and runs are written out by hand.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/plan.h"
#include "engine/plan_test_util.h"

namespace kvbridge::internal {
namespace {

using ::kvbridge::internal::testing::MakeLayout;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A rank with one state buffer per entry of `types` (8-byte slots, 4 of
// them), its types named `names`.
RankLayout Named(std::vector<int32_t> types, std::vector<std::string> names) {
  RankLayout l = MakeLayout({.state_buffers = static_cast<int>(types.size())});
  l.state_types = std::move(types);
  l.state_type_names = std::move(names);
  return l;
}

TEST(StateTypeNamesTest, AStageWithFewerComponentsPairsItsOwnByName) {
  // The stage holds SWA state only; decode holds MAMBA and SWA.
  const RankLayout stage = Named({0}, {"SWA"});
  const RankLayout decode = Named({0, 1}, {"MAMBA", "SWA"});
  Result<StatePairs> pairs = PairStateBuffers(stage, decode);
  ASSERT_TRUE(pairs.ok()) << pairs.status().ToString();
  EXPECT_THAT(pairs->type_dst, ElementsAre(1));
  EXPECT_THAT(pairs->dst, ElementsAre(1u));
  EXPECT_TRUE(CheckCompatible(stage, decode).ok()) << CheckCompatible(stage, decode).ToString();
  // Decode's indices come one section per type (MAMBA slot 0, SWA slot 2);
  // the stage's own one section (slot 3) lands in decode's SWA slot.
  const std::vector<int32_t> src = {3};
  const std::vector<int32_t> dst = {0, kStateSectionEnd, 2};
  Result<std::vector<CopyRun>> runs = PlanState(stage, decode, src, dst);
  ASSERT_TRUE(runs.ok()) << runs.status().ToString();
  EXPECT_THAT(*runs, ElementsAre(CopyRun{BufferClass::kState, 0, 24, 1, 16, 8}));
  // Without names on one side, types pair by position: the counts differ.
  RankLayout unnamed = decode;
  unnamed.state_type_names.clear();
  Result<StatePairs> positional = PairStateBuffers(stage, unnamed);
  ASSERT_FALSE(positional.ok());
  EXPECT_THAT(positional.status().message(),
              HasSubstr("state type count mismatch: prefill 1, decode 2 (state type names given "
                        "by prefill only, so types pair by position)"));
}

TEST(StateTypeNamesTest, ComponentsInAnotherOrderPairByNameWithTheirSlots) {
  const RankLayout prefill = Named({0, 1}, {"MAMBA", "SWA"});
  const RankLayout decode = Named({0, 1}, {"SWA", "MAMBA"});
  Result<StatePairs> pairs = PairStateBuffers(prefill, decode);
  ASSERT_TRUE(pairs.ok()) << pairs.status().ToString();
  EXPECT_THAT(pairs->type_dst, ElementsAre(1, 0));
  EXPECT_THAT(pairs->dst, ElementsAre(1u, 0u));
  // Prefill: MAMBA slot 1, SWA slot 2. Decode: SWA slot 3, MAMBA slot 0.
  const std::vector<int32_t> src = {1, kStateSectionEnd, 2};
  const std::vector<int32_t> dst = {3, kStateSectionEnd, 0};
  Result<std::vector<CopyRun>> runs = PlanState(prefill, decode, src, dst);
  ASSERT_TRUE(runs.ok()) << runs.status().ToString();
  EXPECT_THAT(*runs, ElementsAre(CopyRun{BufferClass::kState, 0, 8, 1, 0, 8},
                                 CopyRun{BufferClass::kState, 1, 16, 0, 24, 8}));
}

TEST(StateTypeNamesTest, RepeatedNamesPairByOccurrenceAndEmptyTypesPairWithNothing) {
  Result<StatePairs> twice =
      PairStateBuffers(Named({0, 1}, {"SWA", "SWA"}), Named({0, 1, 2}, {"MAMBA", "SWA", "SWA"}));
  ASSERT_TRUE(twice.ok()) << twice.status().ToString();
  EXPECT_THAT(twice->type_dst, ElementsAre(1, 2));
  EXPECT_THAT(twice->dst, ElementsAre(1u, 2u));
  // Prefill's type 0 (MAMBA) has no buffer: it needs no MAMBA on decode.
  Result<StatePairs> empty =
      PairStateBuffers(Named({1, 1}, {"MAMBA", "SWA"}), Named({0, 0}, {"SWA"}));
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_THAT(empty->type_dst, ElementsAre(-1, 0));
  EXPECT_THAT(empty->dst, ElementsAre(0u, 1u));
}

TEST(StateTypeNamesTest, AComponentDecodeLacksFailsNamingItAndItsOccurrence) {
  Result<StatePairs> missing =
      PairStateBuffers(Named({0}, {"NSA"}), Named({0, 1}, {"MAMBA", "SWA"}));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("decode holds no state component NSA (occurrence 1) for prefill's state "
                        "type 0; decode's components: MAMBA, SWA"));
  Result<StatePairs> second = PairStateBuffers(Named({0, 1}, {"SWA", "SWA"}), Named({0}, {"SWA"}));
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(),
              HasSubstr("SWA (occurrence 2) for prefill's state type 1"));
  // The compatibility check gives the same verdict (every room fails on it).
  EXPECT_THAT(CheckCompatible(Named({0}, {"NSA"}), Named({0}, {"SWA"})).message(),
              HasSubstr("state component NSA"));
}

TEST(StateTypeNamesTest, BadNamesAreRefusedByName) {
  struct Case {
    std::vector<std::string> names;
    const char* words;
  };
  for (const Case& c : {Case{{"MAMBA"}, "state_type_names has 1 entries for 2 state types"},
                        Case{{"MAMBA", ""}, "state_type_names[1] (0 bytes) is not 1-64 printable"},
                        Case{{"MAMBA", "S W A"}, "state_type_names[1] (5 bytes)"},
                        Case{{"MAMBA", std::string(65, 'A')}, "state_type_names[1] (65 bytes)"},
                        Case{{std::string("SW\x01", 3), "A"}, "state_type_names[0] (3 bytes)"}}) {
    Status s = CheckLayout(Named({0, 1}, c.names));
    EXPECT_THAT(s.message(), HasSubstr(c.words)) << s.ToString();
  }
  EXPECT_TRUE(CheckLayout(Named({0, 1}, {"MAMBA", std::string(64, 'S')})).ok());
}

}  // namespace
}  // namespace kvbridge::internal
