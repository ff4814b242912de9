// The room-failing rule alone (connector/room_failure_rule.h).
#include "connector/room_failure_rule.h"

#include <gtest/gtest.h>

namespace kvbridge::internal {
namespace {

FailureRecord Record(FailureCause cause, Phase phase) {
  FailureRecord r;
  r.cause = cause;
  r.phase = phase;
  r.detail = "what happened";
  return r;
}

TEST(RoomFailureRuleTest, SuccessAndFailedAreFinal) {
  const FailureRecord r = Record(FailureCause::kPeerExited, Phase::kTransferring);
  EXPECT_FALSE(RoomFailure(KVPoll::kSuccess, false, 9, Phase::kTransferring, r));
  EXPECT_FALSE(RoomFailure(KVPoll::kFailed, false, 9, Phase::kTransferring, r));
  EXPECT_FALSE(RoomFailure(KVPoll::kTransferring, true, 9, Phase::kTransferring, r))
      << "a room holding a record keeps its first";
  for (KVPoll live : {KVPoll::kBootstrapping, KVPoll::kWaitingForInput, KVPoll::kTransferring})
    EXPECT_TRUE(RoomFailure(live, false, 9, Phase::kTransferring, r)) << KVPollName(live);
}

TEST(RoomFailureRuleTest, ARanksFailureTakesTheRoomsOwnPhase) {
  // The detector was transferring another request; this one waited for metadata.
  auto kept = RoomFailure(KVPoll::kBootstrapping, false, 9, Phase::kWaitingForMetadata,
                          Record(FailureCause::kPeerExited, Phase::kTransferring));
  ASSERT_TRUE(kept);
  EXPECT_EQ(kept->phase, Phase::kWaitingForMetadata);
  EXPECT_EQ(kept->room, 9u);
  EXPECT_EQ(kept->detail, "what happened");
  // A request's own failure says where it happened.
  kept = RoomFailure(KVPoll::kBootstrapping, false, 9, Phase::kWaitingForMetadata,
                     Record(FailureCause::kInvalidRequest, Phase::kBootstrapping));
  ASSERT_TRUE(kept);
  EXPECT_EQ(kept->phase, Phase::kBootstrapping);
}

TEST(RoomFailureRuleTest, ARequestsOwnFailureDetectedHereTravels) {
  EXPECT_TRUE(PublishesRoomRecord(Record(FailureCause::kAborted, Phase::kBootstrapping), true));
  EXPECT_FALSE(PublishesRoomRecord(Record(FailureCause::kAborted, Phase::kBootstrapping), false))
      << "a record heard from another rank is not published again";
  EXPECT_FALSE(PublishesRoomRecord(Record(FailureCause::kPeerExited, Phase::kTransferring), true))
      << "a rank's failure is published once, as the rank's";
  FailureRecord made_up = Record(FailureCause::kAborted, Phase::kTransferring);
  made_up.mechanism = kGroupPollMechanism;
  EXPECT_FALSE(PublishesRoomRecord(made_up, true))
      << "the group poll's record when none reached this rank is not a finding of its own";
}

}  // namespace
}  // namespace kvbridge::internal
