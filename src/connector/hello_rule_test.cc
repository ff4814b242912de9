// What a proven Hello does to the peer prefill holds at its position, from
// facts alone: each fate, and the facts that must not change it.
#include "connector/hello_rule.h"

#include <gtest/gtest.h>

namespace kvbridge::internal {
namespace {

// A healthy peer, the same process as the Hello's, nothing flowing to it.
OldPeerFacts Held() {
  OldPeerFacts f;
  f.exists = true;
  f.same_incarnation = true;
  f.ready = true;
  return f;
}

TEST(HelloRuleTest, NothingHeldMakesANewPeer) {
  OldPeerFacts f;  // facts of a peer that is not there mean nothing
  f.failed = true;
  f.flows_use_it = true;
  EXPECT_EQ(FateOfOldPeer(f), OldPeerFate::kNone);
  EXPECT_FALSE(KeepsOldPeer(OldPeerFate::kNone));
}

TEST(HelloRuleTest, TheSameProcessAgainIsAnsweredOnTheEndpointItsRequestsUse) {
  OldPeerFacts f = Held();
  f.flows_use_it = true;
  EXPECT_EQ(FateOfOldPeer(f), OldPeerFate::kAnsweredAgain);
  EXPECT_TRUE(KeepsOldPeer(FateOfOldPeer(f)));
  // Nothing flows: our endpoint may be the stuck one; the new one replaces it.
  f.flows_use_it = false;
  EXPECT_EQ(FateOfOldPeer(f), OldPeerFate::kReplaced);
  EXPECT_FALSE(KeepsOldPeer(FateOfOldPeer(f)));
}

TEST(HelloRuleTest, AFailedProcessStaysFailedAndIsNeverReplacedByItsOwnHello) {
  OldPeerFacts f = Held();
  f.failed = true;
  for (bool flows : {false, true}) {
    f.flows_use_it = flows;
    EXPECT_EQ(FateOfOldPeer(f), OldPeerFate::kStaysFailed) << flows;
    EXPECT_TRUE(KeepsOldPeer(FateOfOldPeer(f)));
  }
  // With sglang's server, one to be told (or to tell) takes the new session
  // and still stays failed.
  f.failure_notice = true;
  EXPECT_EQ(FateOfOldPeer(f), OldPeerFate::kTakesNewSession);
  EXPECT_TRUE(KeepsOldPeer(FateOfOldPeer(f)));
}

TEST(HelloRuleTest, AnotherProcessAtThePositionReplacesThePeerFailedOrNot) {
  for (bool failed : {false, true}) {
    for (bool flows : {false, true}) {
      for (bool notice : {false, true}) {
        OldPeerFacts f = Held();
        f.same_incarnation = false;
        f.failed = failed;
        f.flows_use_it = flows;
        f.failure_notice = notice;  // about the old process: no session to give
        EXPECT_EQ(FateOfOldPeer(f), OldPeerFate::kReplacedRestarted) << failed << flows << notice;
        EXPECT_FALSE(KeepsOldPeer(FateOfOldPeer(f)));
      }
    }
  }
}

TEST(HelloRuleTest, APeerThisRankRetiredOrNeverReadyIsReplacedLikeARestartedOne) {
  OldPeerFacts retired = Held();
  retired.retired = true;
  retired.failed = true;  // retiring fails it
  retired.failure_notice = true;
  retired.flows_use_it = true;
  EXPECT_EQ(FateOfOldPeer(retired), OldPeerFate::kReplacedRestarted);
  OldPeerFacts unready = Held();
  unready.ready = false;
  unready.flows_use_it = true;
  EXPECT_EQ(FateOfOldPeer(unready), OldPeerFate::kReplacedRestarted);
}

// A process a record declared failed here (stopped or cut off, alive, not
// yet told) never becomes a peer by its Hello: wherever its Hello would
// make one, it is told; where the held peer stays anyway, nothing changes.
TEST(HelloRuleTest, AProcessDeclaredFailedIsToldAndNeverMadeAPeer) {
  OldPeerFacts none;
  OldPeerFacts retired = Held();
  retired.retired = true;
  OldPeerFacts unready = Held();
  unready.ready = false;
  OldPeerFacts other = Held();  // another incarnation, older or newer, healthy
  other.same_incarnation = false;
  OldPeerFacts idle = Held();  // nothing flows: its own Hello would replace it
  for (OldPeerFacts f : {none, retired, unready, other, idle}) {
    const OldPeerFate before = FateOfOldPeer(f);
    ASSERT_FALSE(KeepsOldPeer(before)) << static_cast<int>(before);
    f.declared_dead = true;
    EXPECT_EQ(FateOfOldPeer(f), OldPeerFate::kToldItFailed) << static_cast<int>(before);
  }
  EXPECT_TRUE(KeepsOldPeer(OldPeerFate::kToldItFailed));  // makes none, replaces none
  OldPeerFacts failed = Held();  // failed by that record: stays failed, as before
  failed.failed = true;
  failed.declared_dead = true;
  EXPECT_EQ(FateOfOldPeer(failed), OldPeerFate::kStaysFailed);
  failed.failure_notice = true;
  EXPECT_EQ(FateOfOldPeer(failed), OldPeerFate::kTakesNewSession);
  OldPeerFacts flowing = Held();
  flowing.flows_use_it = true;
  flowing.declared_dead = true;
  EXPECT_EQ(FateOfOldPeer(flowing), OldPeerFate::kAnsweredAgain);
}

// The record of a peer a new incarnation replaces says which it was: the
// same process (host, boot, pid) rejoining, or another process.
TEST(HelloRuleTest, TheRecordOfAReplacedPeerSaysWhetherItsProcessRejoinedOrWasReplaced) {
  RankId old;
  old.host = "h1";
  old.boot_id = "boot-1";
  old.pid = 41;
  old.incarnation = 0x10;
  RankId now = old;
  now.incarnation = 0x2a;
  EXPECT_EQ(NewIncarnationDetail(old, now), "rejoined as incarnation 0x2a (same process)");
  now.pid = 42;
  EXPECT_EQ(NewIncarnationDetail(old, now), "restarted as pid 42");
  now.pid = 41;  // the same pid after a reboot is another process
  now.boot_id = "boot-2";
  EXPECT_EQ(NewIncarnationDetail(old, now), "restarted as pid 41");
  now.boot_id = "boot-1";  // and on another host too
  now.host = "h2";
  EXPECT_EQ(NewIncarnationDetail(old, now), "restarted as pid 41");
}

SentHello Sent(uint64_t session, const std::string& address) {
  return SentHello{session, Digest{static_cast<uint8_t>(session)},
                   "hello " + std::to_string(session), address};
}

// Decode's Hellos as it sends them again: a challenge may answer any of
// the last kHellosKept to one address, each with its own digest and bytes;
// older ones, and every one before a move to another address, are late.
TEST(HelloRuleTest, AChallengeMayAnswerAnyOfTheLastHellosToOneAddress) {
  std::vector<SentHello> kept;
  for (uint64_t s = 1; s <= 3; ++s) KeepHello(kept, Sent(s, "tcp://a"));
  for (uint64_t s = 1; s <= 3; ++s) {
    SCOPED_TRACE(s);
    const SentHello* h = HelloAnswered(kept, s);
    ASSERT_NE(h, nullptr);
    EXPECT_EQ(h->bytes, "hello " + std::to_string(s));
    EXPECT_EQ(h->digest[0], s);
  }
  EXPECT_EQ(HelloAnswered(kept, 4), nullptr) << "never sent";
  EXPECT_EQ(HelloAnswered(kept, 0), nullptr) << "no session";
  for (uint64_t s = 4; s <= 6; ++s) KeepHello(kept, Sent(s, "tcp://a"));
  ASSERT_EQ(kept.size(), kHellosKept);
  EXPECT_EQ(HelloAnswered(kept, 2), nullptr) << "older than the kept ones";
  EXPECT_NE(HelloAnswered(kept, 3), nullptr);
  EXPECT_NE(HelloAnswered(kept, 6), nullptr);
  // A retry moved to another address: what came over the old one is late.
  KeepHello(kept, Sent(7, "net://a"));
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(HelloAnswered(kept, 6), nullptr);
  EXPECT_NE(HelloAnswered(kept, 7), nullptr);
}

// A hostile stream of refusals, as decode keeps its facts: each taken
// refusal records its attempt (ManagerImpl::OnHelloAckLocked). However many
// come, at most one per Hello attempt is taken, and none once a session
// was answered.
TEST(HelloRuleTest, AStreamOfRefusalsIsTakenOncePerAttemptAndNeverAfterAnAnswer) {
  bool acked = false;
  int refused_attempt = 0, hello_attempts = 0, taken = 0;
  auto refusals = [&](int n) {
    for (int i = 0; i < n; ++i) {
      if (!TakesRefusal(acked, refused_attempt, hello_attempts)) continue;
      refused_attempt = hello_attempts;
      ++taken;
    }
  };
  hello_attempts = 1;
  refusals(50);
  EXPECT_EQ(taken, 1) << "refusals of one attempt";
  hello_attempts = 2;
  refusals(50);
  EXPECT_EQ(taken, 2) << "a second attempt's refusal is taken";
  hello_attempts = 3;
  acked = true;  // attempt 3 was answered
  refusals(50);
  EXPECT_EQ(taken, 2) << "refusals of an answered session";
  hello_attempts = 4;  // a Hello sent again on an answered peer
  refusals(50);
  EXPECT_EQ(taken, 2) << "refusals after an answer, on a later attempt";
}

}  // namespace
}  // namespace kvbridge::internal
