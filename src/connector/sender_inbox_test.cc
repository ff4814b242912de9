// SenderInbox alone: what prefill does with metadata, notices and failures
// of requests (room, decode tp, generation) that no live sender has a flow
// for. The manager's tests (FinalStateTest, GroupFailureTest, ...) drive the
// same rule through real managers; these pin each case with time passed in.
#include "connector/sender_inbox.h"

#include <gtest/gtest.h>

#include <chrono>

namespace kvbridge::internal {
namespace {

using namespace std::chrono_literals;
using Verdict = SenderInbox::MetaVerdict;

const SteadyTime kT0{};

RankId Decode(int tp) {
  RankId id;
  id.role = Role::kDecode;
  id.tp = tp;
  return id;
}

MetaMsg Meta(uint64_t room, uint64_t generation) {
  MetaMsg m;
  m.room = room;
  m.generation = generation;
  m.pages = {1, 2};
  return m;
}

FailureRecord Record(const std::string& detail, uint64_t generation = 0) {
  FailureRecord r;
  r.cause = FailureCause::kAborted;
  r.detail = detail;
  r.generation = generation;
  return r;
}

TEST(ClosedFlowsTest, HoldsTheNewestGenerationPerRoomAndRankAndForgetsTheOldestPastItsLimit) {
  ClosedFlows closed(2);
  closed.Note(7, 0, 3);
  EXPECT_TRUE(closed.Holds(7, 0, 3));
  EXPECT_FALSE(closed.Holds(7, 0, 4));  // the room's next use
  EXPECT_FALSE(closed.Holds(7, 1, 3));  // another decode rank
  EXPECT_FALSE(closed.Holds(8, 0, 3));  // another room
  closed.Note(7, 0, 4);                 // used again and closed again
  EXPECT_TRUE(closed.Holds(7, 0, 4));
  EXPECT_FALSE(closed.Holds(7, 0, 3));
  closed.Note(7, 1, 5);
  EXPECT_EQ(closed.size(), 2u);
  closed.Note(9, 0, 6);  // a third key: (7, 0) was noted first and goes
  EXPECT_EQ(closed.size(), 2u);
  EXPECT_FALSE(closed.Holds(7, 0, 4));
  EXPECT_TRUE(closed.Holds(7, 1, 5));
  EXPECT_TRUE(closed.Holds(9, 0, 6));
}

// Metadata before its sender is held, then handed to the sender with the
// room's other ranks' metadata, and nothing of another room.
TEST(SenderInboxTest, MetadataBeforeItsSenderIsHandedToThatSender) {
  SenderInbox inbox(8);
  EXPECT_EQ(inbox.OnMetaWithoutSender(Meta(5, 1), Decode(0), kT0).kind, Verdict::kHeld);
  EXPECT_EQ(inbox.OnMetaWithoutSender(Meta(5, 2), Decode(1), kT0).kind, Verdict::kHeld);
  EXPECT_EQ(inbox.OnMetaWithoutSender(Meta(6, 3), Decode(0), kT0).kind, Verdict::kHeld);
  SenderInbox::ForNewSender got = inbox.TakeForNewSender(5);
  ASSERT_EQ(got.metas.size(), 2u);
  EXPECT_EQ(got.metas[0].from.tp, 0);
  EXPECT_EQ(got.metas[0].meta.generation, 1u);
  EXPECT_EQ(got.metas[1].from.tp, 1);
  EXPECT_TRUE(got.aborts.empty());
  EXPECT_EQ(inbox.held_metadata(), 1u);  // room 6's
  EXPECT_TRUE(inbox.TakeForNewSender(5).metas.empty());
}

// Decode's notice overtook its metadata: that metadata is answered with the
// failure (nothing may be written) and the sender, when it comes, fails
// with it; metadata of a newer use of the room supersedes the notice.
TEST(SenderInboxTest, ANoticeThatOvertookItsMetadataAnswersItAndFailsTheSender) {
  SenderInbox inbox(8);
  EXPECT_FALSE(inbox.OnNoticeWithoutFlow(5, 0, 1, Record("decode aborted", 1), kT0));
  Verdict v = inbox.OnMetaWithoutSender(Meta(5, 1), Decode(0), kT0);
  EXPECT_EQ(v.kind, Verdict::kAnswerFailed);
  EXPECT_EQ(v.record.detail, "decode aborted");
  EXPECT_EQ(inbox.held_metadata(), 0u);
  SenderInbox::ForNewSender got = inbox.TakeForNewSender(5);
  ASSERT_EQ(got.aborts.size(), 1u);
  EXPECT_EQ(got.aborts[0].first, 0);
  EXPECT_EQ(got.aborts[0].second.generation, 1u);

  EXPECT_FALSE(inbox.OnNoticeWithoutFlow(5, 0, 1, Record("old use"), kT0));
  EXPECT_EQ(inbox.OnMetaWithoutSender(Meta(5, 2), Decode(0), kT0).kind, Verdict::kHeld);
  EXPECT_EQ(inbox.held_aborts(), 0u);  // superseded
  EXPECT_TRUE(inbox.TakeForNewSender(5).aborts.empty());
}

// A live sender adopting metadata uses up the rank's held notice: it fails
// only for the same generation.
TEST(SenderInboxTest, AnAbortIsTakenOnceAndOnlyFailsItsOwnGeneration) {
  SenderInbox inbox(8);
  inbox.OnNoticeWithoutFlow(5, 1, 7, Record("same"), kT0);
  auto r = inbox.TakeAbortFor(5, 1, 7);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->detail, "same");
  EXPECT_FALSE(inbox.TakeAbortFor(5, 1, 7).has_value());  // used up
  inbox.OnNoticeWithoutFlow(5, 1, 7, Record("older use"), kT0);
  EXPECT_FALSE(inbox.TakeAbortFor(5, 1, 8).has_value());
  EXPECT_EQ(inbox.held_aborts(), 0u);
}

// A notice for held metadata of the same request drops that metadata: the
// sender must not adopt a request decode already failed.
TEST(SenderInboxTest, ANoticeDropsTheHeldMetadataOfItsRequestOnly) {
  SenderInbox inbox(8);
  inbox.OnMetaWithoutSender(Meta(5, 1), Decode(0), kT0);
  inbox.OnMetaWithoutSender(Meta(5, 2), Decode(1), kT0);
  inbox.OnNoticeWithoutFlow(5, 0, 1, Record("x"), kT0);
  inbox.OnNoticeWithoutFlow(5, 1, 9, Record("other generation"), kT0);
  SenderInbox::ForNewSender got = inbox.TakeForNewSender(5);
  ASSERT_EQ(got.metas.size(), 1u);
  EXPECT_EQ(got.metas[0].from.tp, 1);
  EXPECT_EQ(got.aborts.size(), 2u);
}

// A notice about a request a released sender served is not kept: it must
// not fail the room's next use (4d71d6f's defect).
TEST(SenderInboxTest, ANoticeAboutAReleasedSendersRequestIsNotKept) {
  SenderInbox inbox(8);
  inbox.OnSenderReleased(5, {{0, 3}, {1, 4}}, nullptr, {}, kT0);
  EXPECT_TRUE(inbox.OnNoticeWithoutFlow(5, 1, 4, Record("late"), kT0));
  EXPECT_EQ(inbox.held_aborts(), 0u);
  EXPECT_FALSE(inbox.OnNoticeWithoutFlow(5, 1, 5, Record("next use"), kT0));
  EXPECT_EQ(inbox.held_aborts(), 1u);
}

// A sender that failed before any metadata came answers that request's
// metadata when it comes later, until the room is used again (new
// generation from that rank, or a new sender).
TEST(SenderInboxTest, AFailureBeforeMetadataAnswersThatRequestsMetadataOnly) {
  SenderInbox inbox(8);
  const FailureRecord failed = Record("prefill tp0 died");
  inbox.OnSenderReleased(5, {}, &failed, {{1, 4}}, kT0);
  Verdict v = inbox.OnMetaWithoutSender(Meta(5, 3), Decode(0), kT0);
  EXPECT_EQ(v.kind, Verdict::kAnswerFailed);
  EXPECT_EQ(v.record.detail, "prefill tp0 died");
  EXPECT_EQ(v.record.generation, 3u);  // named for the metadata it answers
  v = inbox.OnMetaWithoutSender(Meta(5, 4), Decode(1), kT0);
  EXPECT_EQ(v.kind, Verdict::kAnswerFailed);  // the generation it was about
  v = inbox.OnMetaWithoutSender(Meta(5, 5), Decode(1), kT0);
  EXPECT_EQ(v.kind, Verdict::kHeld);  // decode tp1's next request: a new use
  EXPECT_EQ(inbox.held_failures(), 0u);
  inbox.OnSenderReleased(6, {}, &failed, {}, kT0);
  inbox.TakeForNewSender(6);
  EXPECT_EQ(inbox.OnMetaWithoutSender(Meta(6, 1), Decode(0), kT0).kind, Verdict::kHeld);
}

// Held metadata and notices are bounded; past the bound metadata is
// refused (the manager fails that request) and a notice is not kept, while
// a key already held is still replaced.
TEST(SenderInboxTest, HeldMetadataAndNoticesAreBounded) {
  SenderInbox inbox(2);
  EXPECT_EQ(inbox.OnMetaWithoutSender(Meta(1, 1), Decode(0), kT0).kind, Verdict::kHeld);
  EXPECT_EQ(inbox.OnMetaWithoutSender(Meta(2, 1), Decode(0), kT0).kind, Verdict::kHeld);
  EXPECT_EQ(inbox.OnMetaWithoutSender(Meta(3, 1), Decode(0), kT0).kind, Verdict::kOverLimit);
  EXPECT_EQ(inbox.OnMetaWithoutSender(Meta(2, 2), Decode(0), kT0).kind, Verdict::kHeld);
  EXPECT_EQ(inbox.held_metadata(), 2u);
  inbox.OnNoticeWithoutFlow(11, 0, 1, Record("a"), kT0);
  inbox.OnNoticeWithoutFlow(12, 0, 1, Record("b"), kT0);
  inbox.OnNoticeWithoutFlow(13, 0, 1, Record("c"), kT0);
  EXPECT_EQ(inbox.held_aborts(), 2u);
  inbox.OnNoticeWithoutFlow(12, 0, 2, Record("b2"), kT0);
  EXPECT_EQ(inbox.TakeAbortFor(12, 0, 2)->detail, "b2");
}

// The held page and state indices are bounded too, over every held message
// and every way one leaves (a decode peer with the secret held 512 MB in
// 32 messages of 4 Mi pages under the count limit alone).
TEST(SenderInboxTest, HeldIndicesAreBoundedAcrossMessagesAndFreedAsTheyGo) {
  SenderInbox inbox(100, 8192, /*max_held_entries=*/10);
  auto sized = [](uint64_t room, uint64_t generation, int pages, int states) {
    MetaMsg m = Meta(room, generation);
    m.pages.assign(pages, 7);
    m.state.assign(states, 3);
    return m;
  };
  EXPECT_EQ(inbox.OnMetaWithoutSender(sized(1, 1, 4, 2), Decode(0), kT0).kind, Verdict::kHeld);
  EXPECT_EQ(inbox.OnMetaWithoutSender(sized(2, 1, 3, 0), Decode(0), kT0).kind, Verdict::kHeld);
  EXPECT_EQ(inbox.held_entries(), 9u);
  EXPECT_EQ(inbox.OnMetaWithoutSender(sized(3, 1, 2, 0), Decode(0), kT0).kind, Verdict::kOverLimit);
  // A newer use of room 2 replaces its held metadata: counted once.
  EXPECT_EQ(inbox.OnMetaWithoutSender(sized(2, 2, 4, 0), Decode(0), kT0).kind, Verdict::kHeld);
  EXPECT_EQ(inbox.held_entries(), 10u);
  EXPECT_EQ(inbox.TakeForNewSender(1).metas.size(), 1u);  // adopted: freed
  EXPECT_EQ(inbox.held_entries(), 4u);
  EXPECT_EQ(inbox.OnMetaWithoutSender(sized(3, 1, 6, 0), Decode(0), kT0).kind, Verdict::kHeld);
  inbox.OnNoticeWithoutFlow(3, 0, 1, Record("a"), kT0);  // dropped by its notice
  EXPECT_EQ(inbox.held_entries(), 4u);
  EXPECT_TRUE(inbox.HoldForNextSender(sized(4, 1, 1, 1), Decode(1), kT0));
  EXPECT_FALSE(inbox.HoldForNextSender(sized(5, 1, 7, 0), Decode(1), kT0));  // 6 + 7 > 10
  EXPECT_EQ(inbox.held_entries(), 6u);
  inbox.DropMetaIf([](const RankId& r) { return r.tp == 1; });  // its peer failed
  EXPECT_EQ(inbox.held_entries(), 4u);
  inbox.Expire(kT0 + 11s, 10s);
  EXPECT_EQ(inbox.held_entries(), 0u);
  EXPECT_EQ(inbox.held_metadata(), 0u);
}

// Everything held expires after the waiting timeout; closed flows do not.
TEST(SenderInboxTest, WhatIsHeldExpiresButClosedFlowsStay) {
  SenderInbox inbox(8);
  const FailureRecord failed = Record("f");
  inbox.OnMetaWithoutSender(Meta(1, 1), Decode(0), kT0);
  inbox.OnNoticeWithoutFlow(2, 0, 1, Record("a"), kT0 + 5s);
  inbox.OnSenderReleased(3, {{0, 9}}, &failed, {}, kT0);
  inbox.Expire(kT0 + 10s, 10s);  // not older than 10 s: kept
  EXPECT_EQ(inbox.held_metadata(), 1u);
  EXPECT_EQ(inbox.held_failures(), 1u);
  inbox.Expire(kT0 + 11s, 10s);
  EXPECT_EQ(inbox.held_metadata(), 0u);
  EXPECT_EQ(inbox.held_failures(), 0u);
  EXPECT_EQ(inbox.held_aborts(), 1u);  // came at 5 s
  inbox.Expire(kT0 + 16s, 10s);
  EXPECT_EQ(inbox.held_aborts(), 0u);
  EXPECT_TRUE(inbox.OnNoticeWithoutFlow(3, 0, 9, Record("late"), kT0 + 60s));
}

// Held metadata from a failed peer goes; a rejoin drops all of it.
TEST(SenderInboxTest, MetadataOfAFailedPeerOrAnOldIncarnationIsDropped) {
  SenderInbox inbox(8);
  inbox.OnMetaWithoutSender(Meta(1, 1), Decode(0), kT0);
  inbox.OnMetaWithoutSender(Meta(1, 2), Decode(1), kT0);
  inbox.DropMetaIf([](const RankId& from) { return from.tp == 1; });
  SenderInbox::ForNewSender got = inbox.TakeForNewSender(1);
  ASSERT_EQ(got.metas.size(), 1u);
  EXPECT_EQ(got.metas[0].from.tp, 0);
  inbox.OnMetaWithoutSender(Meta(2, 1), Decode(0), kT0);
  inbox.DropAllMeta();
  EXPECT_EQ(inbox.held_metadata(), 0u);
}

}  // namespace
}  // namespace kvbridge::internal
