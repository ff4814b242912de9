// The rule a decode rank applies to a room record relayed by a prefill rank
// (generation 0, sglang's own server): what a hostile or confused prefill
// peer sends is refused with a reason, what RelayRoomFailureLocked sends is
// taken.
#include "connector/relay_rule.h"

#include <gtest/gtest.h>

namespace kvbridge::internal {
namespace {

RankId Prefill(int dp, int tp, std::string instance = "") {
  RankId id;
  id.role = Role::kPrefill;
  id.dp = dp;
  id.tp = tp;
  id.instance = std::move(instance);
  return id;
}

RoomFailedMsg Relayed(uint64_t room) {
  RoomFailedMsg m;
  m.room = room;
  m.generation = 0;
  m.quiesced = true;
  m.record.room = room;
  m.record.cause = FailureCause::kInvalidRequest;
  m.record.origin.role = Role::kDecode;
  m.record.origin.tp = 1;
  return m;
}

// Room 7 on this decode rank reads from prefill instance "a", dp 1.
std::unique_ptr<ReceiverRoom> HeldRoom() {
  auto room = std::make_unique<ReceiverRoom>(7, 42, SteadyTime{}, WallTime{});
  room->prefill_dp_rank = 1;
  ReceiverSource s;
  s.prefill = Shared<RankId>(Prefill(1, 0, "a"));
  room->sources.push_back(s);
  return room;
}

TEST(RelayRuleTest, WhatAWitnessOfTheRoomRelaysIsTaken) {
  auto room = HeldRoom();
  // tp1 is no source of the room (a witness): any rank of its instance and dp.
  EXPECT_EQ(RelayedRecordRefusal(Prefill(1, 1, "a"), Relayed(7), room.get()), std::nullopt);
  EXPECT_EQ(RelayedRecordRefusal(Prefill(1, 0, "a"), Relayed(7), room.get()), std::nullopt);
}

TEST(RelayRuleTest, ARoomNotHeldHereKeepsTheRecordFromAnyPrefillRank) {
  EXPECT_EQ(RelayedRecordRefusal(Prefill(3, 2, "z"), Relayed(9), nullptr), std::nullopt);
  auto unresolved = std::make_unique<ReceiverRoom>(9, 1, SteadyTime{}, WallTime{});
  EXPECT_EQ(RelayedRecordRefusal(Prefill(3, 2, "z"), Relayed(9), unresolved.get()), std::nullopt);
}

TEST(RelayRuleTest, APrefillRankTheRoomDoesNotReadFromIsRefused) {
  auto room = HeldRoom();
  auto other_dp = RelayedRecordRefusal(Prefill(0, 0, "a"), Relayed(7), room.get());
  ASSERT_TRUE(other_dp.has_value());
  EXPECT_NE(other_dp->find("reads from prefill instance 'a' dp1"), std::string::npos) << *other_dp;
  auto other_instance = RelayedRecordRefusal(Prefill(1, 0, "b"), Relayed(7), room.get());
  ASSERT_TRUE(other_instance.has_value());
  EXPECT_NE(other_instance->find("not from prefill[b]"), std::string::npos) << *other_instance;
}

TEST(RelayRuleTest, ARecordForAnotherRoomOrNotARoomsIsRefused) {
  auto room = HeldRoom();
  RoomFailedMsg elsewhere = Relayed(7);
  elsewhere.record.room = 8;  // would fail room 8 through a message for room 7
  auto why = RelayedRecordRefusal(Prefill(1, 0, "a"), elsewhere, room.get());
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(*why, "the record names room 8, not room 7");

  RoomFailedMsg rank_death = Relayed(7);
  rank_death.record.cause = FailureCause::kPeerExited;  // fences a rank, not a room
  why = RelayedRecordRefusal(Prefill(1, 0, "a"), rank_death, room.get());
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("is not a room's"), std::string::npos) << *why;

  RoomFailedMsg no_room = Relayed(0);
  EXPECT_TRUE(RelayedRecordRefusal(Prefill(1, 0, "a"), no_room, nullptr).has_value());
}

TEST(RelayRuleTest, ADecodeRankIsNoRelay) {
  RankId decode = Prefill(1, 0, "a");
  decode.role = Role::kDecode;
  auto why = RelayedRecordRefusal(decode, Relayed(7), HeldRoom().get());
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("is not a prefill rank"), std::string::npos) << *why;
}

// Review finding: a record's fields are the sender's word. One that said
// this process detected it was published to the registry as this rank's
// own finding; one detected in the future matched every later use of its
// room id.
TEST(RecordFromPeerTest, ADetectionClaimedForThisProcessIsKeptAsTheSendersAndTheFutureIsNow) {
  RankId self = Prefill(0, 0);
  self.pid = 10;
  self.incarnation = 7;
  RankId peer;
  peer.role = Role::kDecode;
  peer.tp = 1;
  peer.pid = 20;
  const WallTime now = WallTime{} + std::chrono::hours(1000);
  FailureRecord r = Relayed(5).record;
  r.detected_by = self;
  r.detected_at = now + std::chrono::hours(24 * 365);
  const FailureRecord taken = AsTakenFromPeer(r, peer, self, now);
  EXPECT_TRUE(taken.detected_by.SameRank(peer));
  EXPECT_EQ(taken.detected_by.pid, 20);
  EXPECT_EQ(taken.detected_at, now);
  // This process under an earlier incarnation (before a rejoin) is still
  // this process; another at this position (another pid) is not. A time
  // already past is kept.
  r.detected_by.incarnation = 6;
  EXPECT_TRUE(AsTakenFromPeer(r, peer, self, now).detected_by.SameRank(peer));
  r.detected_by.pid = 11;
  r.detected_at = now - std::chrono::seconds(3);
  const FailureRecord kept = AsTakenFromPeer(r, peer, self, now);
  EXPECT_EQ(kept.detected_by.pid, 11);
  EXPECT_TRUE(kept.detected_by.SameRank(self));
  EXPECT_EQ(kept.detected_at, now - std::chrono::seconds(3));
}

// Review finding: a record read from the registry is dated by the rank
// that published it, which may date it in the future as a peer may.
TEST(RecordFromPeerTest, ARecordFromTheRegistryIsDatedNoLaterThanItsReading) {
  const WallTime now = WallTime{} + std::chrono::hours(1000);
  FailureRecord r = Relayed(5).record;
  r.detected_at = now + std::chrono::hours(24);
  EXPECT_EQ(DatedNoLaterThan(r, now).detected_at, now);
  r.detected_at = now - std::chrono::seconds(3);
  EXPECT_EQ(DatedNoLaterThan(r, now).detected_at, now - std::chrono::seconds(3));
}

}  // namespace
}  // namespace kvbridge::internal
