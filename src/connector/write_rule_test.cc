// The rule of which prefill rank may still write into a request's pages,
// alone (connector/write_rule.h).
#include "connector/write_rule.h"

#include <gtest/gtest.h>

namespace kvbridge::internal {
namespace {

// A source given the pages, its peer connected, answered and then failed
// for `cause`, with a write grant (on another host unless said).
SourceWriteFacts FailedWithGrant(FailureCause cause) {
  SourceWriteFacts f;
  f.pages_sent = true;
  f.peer_failed = true;
  f.acked = true;
  f.cause = cause;
  f.has_grant = true;
  return f;
}

TEST(WriteRuleTest, ALivePeerHoldingThePagesMayWriteUntilItSaysItStopped) {
  SourceWriteFacts f;
  f.pages_sent = true;
  f.acked = true;
  EXPECT_EQ(NoMoreWrites(f), WriteEnd::kMayStillWrite);
  f.acked = false;  // the page list is held for it: it goes out on the answer
  EXPECT_EQ(NoMoreWrites(f), WriteEnd::kMayStillWrite);
  f.said_quiesced = true;
  EXPECT_EQ(NoMoreWrites(f), WriteEnd::kSaidQuiesced);
}

TEST(WriteRuleTest, ASourceNeverGivenPagesWritesNothingWhateverItsPeerIs) {
  for (FailureCause cause : {FailureCause::kPeerExited, FailureCause::kPeerUnreachable,
                             FailureCause::kPeerUnresponsive}) {
    SourceWriteFacts f = FailedWithGrant(cause);
    f.pages_sent = false;
    EXPECT_EQ(NoMoreWrites(f), WriteEnd::kNeverGivenPages) << FailureCauseName(cause);
    f.pages_sent = true;
    f.dummy = true;
    EXPECT_EQ(NoMoreWrites(f), WriteEnd::kDummy) << FailureCauseName(cause);
  }
  SourceWriteFacts done = FailedWithGrant(FailureCause::kPeerUnresponsive);
  done.request_done = true;
  EXPECT_EQ(NoMoreWrites(done), WriteEnd::kDone);
}

// A stopped or silent rank, or one cut off behind a partition, may be alive
// with its writes queued: only the revoke of its grant ends them.
TEST(WriteRuleTest, AFailedPeerThatMayBeAliveWritesUntilItsGrantIsRevoked) {
  for (FailureCause cause : {FailureCause::kPeerUnresponsive, FailureCause::kPeerUnreachable,
                             FailureCause::kLocalError}) {
    for (bool here : {false, true}) {
      SourceWriteFacts f = FailedWithGrant(cause);
      f.on_this_host = here;
      EXPECT_EQ(NoMoreWrites(f), WriteEnd::kMayStillWrite)
          << FailureCauseName(cause) << (here ? " on this host" : "");
      f.grant_revoked = true;
      EXPECT_EQ(NoMoreWrites(f), WriteEnd::kFenced) << FailureCauseName(cause);
      // A mapping of the pages outlives the revoke.
      f.maps_pages = true;
      EXPECT_EQ(NoMoreWrites(f), WriteEnd::kMayStillWrite) << FailureCauseName(cause);
      if (!here) continue;  // a mapping is of this host's memory
      f.rejoined = true;    // its process waited for its writes before rejoining
      EXPECT_EQ(NoMoreWrites(f), WriteEnd::kRejoined) << FailureCauseName(cause);
    }
  }
}

// The same process back under a new incarnation waited, before rejoining,
// only for the writes decode cannot revoke (a mapping of the pages, or none
// under a grant, on this host): the rest may still be on their way until
// the revoke, whatever the record says of its old incarnation ("restarted",
// taken as exited, is what replacing the peer records when it was not failed).
TEST(WriteRuleTest, ARejoinedProcessIsAliveAndItsRevocableWritesEndOnlyWithTheRevoke) {
  for (FailureCause cause : {FailureCause::kPeerExited, FailureCause::kPeerUnresponsive}) {
    SourceWriteFacts f = FailedWithGrant(cause);
    f.rejoined = true;
    for (bool here : {false, true}) {
      f.on_this_host = here;
      f.grant_revoked = false;
      EXPECT_EQ(NoMoreWrites(f), WriteEnd::kMayStillWrite) << FailureCauseName(cause) << here;
      f.grant_revoked = true;
      EXPECT_EQ(NoMoreWrites(f), WriteEnd::kFenced) << FailureCauseName(cause) << here;
    }
    // Unrevocable on this host: the rejoin waited for them.
    f.grant_revoked = false;
    f.on_this_host = true;
    f.maps_pages = true;
    EXPECT_EQ(NoMoreWrites(f), WriteEnd::kRejoined) << FailureCauseName(cause);
    f.maps_pages = false;
    f.has_grant = false;
    EXPECT_EQ(NoMoreWrites(f), WriteEnd::kRejoined) << FailureCauseName(cause);
    // Without a grant on another host the rejoin did not wait: it ends as
    // any failed peer's does (here: not at all, but for a cut-off link).
    f.on_this_host = false;
    EXPECT_NE(NoMoreWrites(f), WriteEnd::kRejoined) << FailureCauseName(cause);
  }
  // Not rejoined, a record of exit ends it at once.
  EXPECT_EQ(NoMoreWrites(FailedWithGrant(FailureCause::kPeerExited)), WriteEnd::kExited);
}

TEST(WriteRuleTest, AnExitedPeerWritesNothingEvenThroughAMapping) {
  SourceWriteFacts f = FailedWithGrant(FailureCause::kPeerExited);
  EXPECT_EQ(NoMoreWrites(f), WriteEnd::kExited);
  f.maps_pages = true;
  f.on_this_host = true;
  EXPECT_EQ(NoMoreWrites(f), WriteEnd::kExited);
}

// Without grants (a transport that has none), a peer cut off on another host
// had its connection closed when it failed: that carries nothing more. On
// this host a link error says nothing of the process.
TEST(WriteRuleTest, WithoutAGrantOnlyACutOffOnAnotherHostClosesTheWay) {
  SourceWriteFacts f = FailedWithGrant(FailureCause::kPeerUnreachable);
  f.has_grant = false;
  EXPECT_EQ(NoMoreWrites(f), WriteEnd::kConnectionClosed);
  f.on_this_host = true;
  EXPECT_EQ(NoMoreWrites(f), WriteEnd::kMayStillWrite);
  f = FailedWithGrant(FailureCause::kPeerUnresponsive);
  f.has_grant = false;
  EXPECT_EQ(NoMoreWrites(f), WriteEnd::kMayStillWrite) << "a silent rank may be stopped, not cut";
}

// A failed peer that never answered our Hello never got the page list: it
// was held for it and dropped when the peer failed.
TEST(WriteRuleTest, AFailedPeerThatNeverAnsweredNeverHadThePages) {
  SourceWriteFacts f = FailedWithGrant(FailureCause::kPeerUnresponsive);
  f.acked = false;
  EXPECT_EQ(NoMoreWrites(f), WriteEnd::kNeverAnswered);
  f.peer_known = false;  // gone from the table altogether
  EXPECT_EQ(NoMoreWrites(f), WriteEnd::kForgotten);
}

TEST(WriteRuleTest, EveryEndHasAName) {
  for (int e = 0; e <= static_cast<int>(WriteEnd::kConnectionClosed); ++e)
    EXPECT_STRNE(WriteEndName(static_cast<WriteEnd>(e)), "?") << e;
}

}  // namespace
}  // namespace kvbridge::internal
