// The phase-deadline rule alone (connector/deadline_rule.h): rooms built by
// hand, scripted times, no manager, clock or thread.
#include "connector/deadline_rule.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kvbridge::internal {
namespace {

using std::chrono::milliseconds;

const SteadyTime kT0 = SteadyTime{} + std::chrono::hours(1);
const PhaseTimeouts kTimeouts{milliseconds(5000), milliseconds(30000), milliseconds(10000)};

RankId Rank(Role role, int tp) {
  RankId r;
  r.role = role;
  r.tp = tp;
  r.host = "h";
  r.pid = 100 + tp;
  return r;
}

// A prefill request that expects metadata from decode tp0..tp3 and got it
// from those in `arrived`.
std::unique_ptr<SenderRoom> Sender(std::initializer_list<int> arrived) {
  auto room = std::make_unique<SenderRoom>(9, kT0, WallTime{});
  room->expected_decode = {0, 1, 2, 3};
  for (int d : arrived) room->flows[d].decode = Rank(Role::kDecode, d);
  return room;
}

// Decode ranks this prefill rank met (the others it never heard from).
std::vector<RankId> Met(std::initializer_list<RankId> met) { return met; }

RankId DecodeAt(int dp, int tp, std::string instance = "") {
  RankId r = Rank(Role::kDecode, tp);
  r.dp = dp;
  r.instance = std::move(instance);
  return r;
}

TEST(DeadlineRuleTest, MissingMetadataNamesTheFirstSilentDecodeRankThisRankMet) {
  auto held = Sender({0, 2});
  const SenderRoom& room = *held;
  const auto met = Met({Rank(Role::kDecode, 3)});  // tp1 never met
  EXPECT_FALSE(SenderDeadline(room, kT0 + kTimeouts.waiting, kTimeouts, met));
  auto b = SenderDeadline(room, kT0 + kTimeouts.waiting + milliseconds(1), kTimeouts, met);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->detail, "no metadata from decode tp1 tp3 within 30.0 s");
  ASSERT_TRUE(b->origin);
  EXPECT_EQ(b->origin->tp, 3);
  EXPECT_EQ(b->phase, Phase::kWaitingForMetadata);
  EXPECT_STREQ(b->mechanism, "phase deadline");
  // Met none of them: the rank names itself (the caller's origin).
  b = SenderDeadline(room, kT0 + kTimeouts.waiting + milliseconds(1), kTimeouts, Met({}));
  ASSERT_TRUE(b);
  EXPECT_FALSE(b->origin);
}

TEST(DeadlineRuleTest, NoDecodeRankKnownYetSaysNoneSentMetadata) {
  SenderRoom room(9, kT0, WallTime{});  // expected_decode learned from the first metadata
  auto b = SenderDeadline(room, kT0 + milliseconds(30001), kTimeouts, Met({}));
  ASSERT_TRUE(b);
  EXPECT_EQ(b->detail, "no decode rank sent metadata within 30.0 s");
}

TEST(DeadlineRuleTest, ASenderWaitingForInputBlamesTheApplicationInItsPhase) {
  auto held = Sender({0, 1, 2, 3});
  SenderRoom& room = *held;
  room.state.store(static_cast<int>(KVPoll::kWaitingForInput));
  room.phase = Phase::kWaitingForInput;
  auto b = SenderDeadline(room, kT0 + milliseconds(30001), kTimeouts, Met({}));
  ASSERT_TRUE(b);
  EXPECT_EQ(b->detail, "the application sent no chunk within 30.0 s");
  EXPECT_FALSE(b->origin);
  EXPECT_EQ(b->phase, Phase::kWaitingForInput);
}

TEST(DeadlineRuleTest, WritesInFlightAreJudgedByTheTransferTimeoutNamingTheirDecodeRank) {
  auto held = Sender({0, 1, 2, 3});
  SenderRoom& room = *held;
  room.state.store(static_cast<int>(KVPoll::kTransferring));
  room.phase = Phase::kTransferring;
  room.inflight = 1;
  room.flows[2].inflight = 1;  // tp0 and tp1 have nothing in flight
  room.flows[2].meta.generation = 77;
  EXPECT_FALSE(SenderDeadline(room, kT0 + kTimeouts.transfer, kTimeouts, Met({})));
  auto b = SenderDeadline(room, kT0 + kTimeouts.transfer + milliseconds(1), kTimeouts, Met({}));
  ASSERT_TRUE(b);
  ASSERT_TRUE(b->origin);
  EXPECT_EQ(b->origin->tp, 2);
  EXPECT_EQ(b->detail, "writes to decode tp2 not completed within 10.0 s");
  EXPECT_STREQ(b->mechanism, "transfer deadline");
  EXPECT_EQ(b->generation, 77u);
  EXPECT_EQ(b->phase, Phase::kTransferring);
}

// Every source's handshake completed.
std::optional<PendingHandshake> Done(const ReceiverSource&) { return std::nullopt; }

TEST(DeadlineRuleTest, AReceiverWithoutMetadataBlamesTheApplication) {
  ReceiverRoom room(9, 5, kT0, WallTime{});
  room.initialized = room.resolved = true;
  room.phase = Phase::kWaitingForMetadata;
  room.state = static_cast<int>(KVPoll::kWaitingForInput);  // its handshakes completed
  EXPECT_FALSE(ReceiverDeadline(room, kT0 + kTimeouts.waiting, kTimeouts, Done));
  auto b = ReceiverDeadline(room, kT0 + kTimeouts.waiting + milliseconds(1), kTimeouts, Done);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->detail, "the application did not call SendMetadata");
  EXPECT_FALSE(b->origin);
  EXPECT_EQ(b->phase, Phase::kWaitingForMetadata);
}

TEST(DeadlineRuleTest, AReceiverNamesTheFirstSourceWhoseLastChunkNeverCame) {
  ReceiverRoom room(9, 5, kT0, WallTime{});
  room.initialized = room.resolved = room.meta_given = true;
  room.phase = Phase::kTransferring;
  for (int tp : {0, 1, 2}) {
    ReceiverSource s;
    s.prefill = Shared<RankId>(Rank(Role::kPrefill, tp));
    room.sources.push_back(s);
  }
  room.sources[0].dummy = true;          // sends nothing to this rank
  room.sources[1].last_received = true;  // done
  auto b = ReceiverDeadline(room, kT0 + milliseconds(31500), kTimeouts, Done);
  ASSERT_TRUE(b);
  ASSERT_TRUE(b->origin);
  EXPECT_EQ(b->origin->tp, 2);
  EXPECT_EQ(b->detail, "no chunk from prefill tp2 for 31.5 s");
  EXPECT_EQ(b->phase, Phase::kTransferring);
  room.sources[2].last_received = true;  // every source finished: nothing to blame
  EXPECT_FALSE(ReceiverDeadline(room, kT0 + milliseconds(31500), kTimeouts, Done));
}

// A room still bootstrapping (resolved, sglang's decode waiting for
// WaitingForInput before SendMetadata) whose sources' handshakes did not
// all complete: the deadline names that handshake, not the application.
void MakeBootstrapping(ReceiverRoom& room) {
  room.initialized = room.resolved = true;
  room.phase = Phase::kBootstrapping;
  for (int tp : {0, 1}) {
    ReceiverSource s;
    s.peer_key = SharedKey("prefill/" + std::to_string(tp));
    s.prefill = Shared<RankId>(Rank(Role::kPrefill, tp));
    room.sources.push_back(s);
  }
}

TEST(DeadlineRuleTest, AHandshakeRefusedAsDeclaredFailedNamesThisProcessAndTheRecord) {
  ReceiverRoom room(9, 5, kT0, WallTime{});
  MakeBootstrapping(room);
  // tp0 has not answered yet, tp1 refused: the refusal is what holds it.
  auto pending = [](const ReceiverSource& s) -> std::optional<PendingHandshake> {
    if (s.prefill->tp != 1) return PendingHandshake{};
    return PendingHandshake{7, "a failure record declared this process failed: room 3: exited."};
  };
  EXPECT_FALSE(ReceiverDeadline(room, kT0 + kTimeouts.waiting, kTimeouts, pending));
  auto b = ReceiverDeadline(room, kT0 + milliseconds(30500), kTimeouts, pending);
  ASSERT_TRUE(b);
  EXPECT_FALSE(b->origin) << "named " << b->origin->ShortName() << ", not this process";
  EXPECT_EQ(
      b->detail,
      "prefill tp1 refused this process's handshake 7 times in 30.5 s: a failure record "
      "declared this process failed: room 3: exited; no registry told this process so, and it "
      "has not fenced itself: restart it");
  EXPECT_EQ(b->phase, Phase::kBootstrapping);
}

TEST(DeadlineRuleTest, AHandshakeNeverAnsweredNamesThatPrefillRank) {
  ReceiverRoom room(9, 5, kT0, WallTime{});
  MakeBootstrapping(room);
  auto pending = [](const ReceiverSource& s) -> std::optional<PendingHandshake> {
    if (s.prefill->tp != 1) return std::nullopt;
    return PendingHandshake{};
  };
  auto b = ReceiverDeadline(room, kT0 + milliseconds(30500), kTimeouts, pending);
  ASSERT_TRUE(b);
  ASSERT_TRUE(b->origin);
  EXPECT_EQ(b->origin->tp, 1);
  EXPECT_EQ(b->detail, "handshake with prefill tp1 not completed in 30.5 s");
  EXPECT_EQ(b->phase, Phase::kBootstrapping);
  // Every handshake done and still no metadata: the application.
  b = ReceiverDeadline(room, kT0 + milliseconds(30500), kTimeouts, Done);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->detail, "the application did not call SendMetadata");
  // Metadata given before the handshake (kvbridge's own order: the room
  // says WaitingForInput, its metadata held): still the handshake, not
  // "no chunk from" a rank that was never reached.
  room.meta_given = true;
  room.state = static_cast<int>(KVPoll::kWaitingForInput);
  b = ReceiverDeadline(room, kT0 + milliseconds(30500), kTimeouts, pending);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->detail, "handshake with prefill tp1 not completed in 30.5 s");
}

// Review finding (4): with several decode dp ranks or instances, a rank at
// the silent tp was named whichever group it belonged to.
TEST(DeadlineRuleTest, AMissingRankIsLookedForInTheGroupWhoseMetadataCame) {
  auto room = std::make_unique<SenderRoom>(9, kT0, WallTime{});
  room->expected_decode = {0, 1};
  room->flows[0].decode = DecodeAt(1, 0, "b");  // decode[b] dp1 tp0 sent its metadata
  // Met first: tp1 of dp0 and of instance a; the one that holds it is met last.
  const auto met =
      Met({DecodeAt(0, 1, "b"), DecodeAt(1, 1, "a"), DecodeAt(1, 0, "b"), DecodeAt(1, 1, "b")});
  auto b = SenderDeadline(*room, kT0 + milliseconds(30001), kTimeouts, met);
  ASSERT_TRUE(b);
  ASSERT_TRUE(b->origin);
  EXPECT_EQ(b->origin->dp, 1);
  EXPECT_EQ(b->origin->tp, 1);
  EXPECT_EQ(b->origin->instance, "b");
  EXPECT_EQ(b->detail, "no metadata from decode tp1 within 30.0 s");
  // That rank never met: nobody else's rank is named in its place.
  b = SenderDeadline(*room, kT0 + milliseconds(30001), kTimeouts,
                     Met({DecodeAt(0, 1, "b"), DecodeAt(1, 1, "a")}));
  ASSERT_TRUE(b);
  EXPECT_FALSE(b->origin);
}

TEST(DeadlineRuleTest, AMissingRankIsLookedForInTheStageWhoseMetadataCame) {
  // With sglang's server a prefill stage meets every decode stage of its dp.
  auto room = std::make_unique<SenderRoom>(9, kT0, WallTime{});
  room->expected_decode = {0, 1};
  room->flows[0].decode = DecodeAt(0, 0);
  room->flows[0].decode.pp = 1;
  RankId stage0 = DecodeAt(0, 1);
  RankId stage1 = DecodeAt(0, 1);
  stage1.pp = 1;
  auto b = SenderDeadline(*room, kT0 + milliseconds(30001), kTimeouts, Met({stage0, stage1}));
  ASSERT_TRUE(b);
  ASSERT_TRUE(b->origin);
  EXPECT_EQ(b->origin->pp, 1);
  EXPECT_EQ(b->origin->tp, 1);
}

}  // namespace
}  // namespace kvbridge::internal
