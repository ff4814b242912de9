// The liveness rule alone (connector/liveness_rule.h): scripted times and
// process states, no threads, no clock, no manager.
#include "connector/liveness_rule.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <optional>

namespace kvbridge::internal {
namespace {

using std::chrono::milliseconds;
using Kind = LivenessVerdict::Kind;

constexpr std::chrono::microseconds kLimit = milliseconds(1000);  // interval x misses
const SteadyTime kT0 = SteadyTime{} + std::chrono::hours(1);

// A prefill rank on another host that answered the handshake and has been
// heard since: what a healthy peer looks like to the ticker.
Peer ReadyPeer() {
  Peer p;
  p.key = "prefill/dp0/tp0/pp0/cp0";
  p.tpeer = 7;
  p.ready = true;
  p.acked = true;
  p.heard_since_ready = true;
  p.last_heard = kT0;
  p.hello_at = kT0;
  p.hello_attempts = 1;
  return p;
}

// What /proc says, and how often it was asked.
struct Proc {
  ProcessState state = ProcessState::kUnknown;
  int asked = 0;
  std::function<ProcessState()> fn() {
    return [this] {
      ++asked;
      return state;
    };
  }
};

LivenessVerdict Judge(const Peer& p, SteadyTime now, Proc& proc, bool this_rank_failed = false) {
  return JudgeLiveness(p, now, kLimit, this_rank_failed, proc.fn());
}

TEST(LivenessRuleTest, AHeardPeerIsBeatenAndLeftAloneWithoutAskingProc) {
  Proc proc;
  const LivenessVerdict v = Judge(ReadyPeer(), kT0 + kLimit, proc);  // at the limit, not past it
  EXPECT_EQ(v.kind, Kind::kQuiet);
  EXPECT_TRUE(v.beat);
  EXPECT_EQ(proc.asked, 0);
}

TEST(LivenessRuleTest, APeerWithoutAnEndpointGetsNothing) {
  Peer p = ReadyPeer();
  p.tpeer = 0;
  Proc proc;
  const LivenessVerdict v = Judge(p, kT0 + 100 * kLimit, proc);
  EXPECT_EQ(v.kind, Kind::kQuiet);
  EXPECT_FALSE(v.beat);
  EXPECT_EQ(proc.asked, 0);
}

TEST(LivenessRuleTest, SilentPastTheLimitOnAnotherHostIsBlamedByHeartbeat) {
  Proc proc;  // kUnknown: nothing to read across hosts
  const LivenessVerdict v = Judge(ReadyPeer(), kT0 + kLimit + milliseconds(250), proc);
  EXPECT_EQ(v.kind, Kind::kBlame);
  EXPECT_EQ(v.silence, "silent for 1.25 s");
  EXPECT_STREQ(v.mechanism, "heartbeat");
  EXPECT_EQ(v.process, ProcessState::kUnknown);
  EXPECT_TRUE(v.beat);  // still alive to us until the blame is applied
  EXPECT_EQ(proc.asked, 1);
}

TEST(LivenessRuleTest, ARunningPeerOnThisHostIsBusyUntilTenLimitsThenUnresponsive) {
  Proc proc{ProcessState::kRunning};
  EXPECT_EQ(Judge(ReadyPeer(), kT0 + 2 * kLimit, proc).kind, Kind::kQuiet);
  EXPECT_EQ(Judge(ReadyPeer(), kT0 + 10 * kLimit, proc).kind, Kind::kQuiet);
  const LivenessVerdict v = Judge(ReadyPeer(), kT0 + 10 * kLimit + milliseconds(1), proc);
  EXPECT_EQ(v.kind, Kind::kBlame);
  EXPECT_EQ(v.process, ProcessState::kRunning);
  EXPECT_STREQ(v.mechanism, "heartbeat");
}

TEST(LivenessRuleTest, AnExitedOrStoppedPeerIsBlamedAtTheLimit) {
  for (ProcessState ps : {ProcessState::kExited, ProcessState::kStopped}) {
    Proc proc{ps};
    const LivenessVerdict v = Judge(ReadyPeer(), kT0 + kLimit + milliseconds(1), proc);
    EXPECT_EQ(v.kind, Kind::kBlame) << DescribeProcessState(ps);
    EXPECT_EQ(v.process, ps);
  }
}

TEST(LivenessRuleTest, APeerNotHeardSinceItsHandshakeGetsTheHandshakeBudget) {
  Peer p = ReadyPeer();
  p.heard_since_ready = false;  // our answer may not have reached it yet
  Proc proc;
  EXPECT_EQ(Judge(p, kT0 + Peer::kHandshakeBudget * kLimit, proc).kind, Kind::kQuiet);
  EXPECT_EQ(proc.asked, 0);
  const LivenessVerdict v =
      Judge(p, kT0 + Peer::kHandshakeBudget * kLimit + milliseconds(10), proc);
  EXPECT_EQ(v.kind, Kind::kBlame);
  EXPECT_EQ(v.silence, "silent for 10.01 s since the handshake");
  EXPECT_STREQ(v.mechanism, "handshake");
}

TEST(LivenessRuleTest, AnUnansweredHelloIsSentAgainAfterTwoLimitsThenFourThenBlamed) {
  Peer p = ReadyPeer();
  p.acked = false;
  Proc proc{ProcessState::kRunning};
  // First attempt: two limits of patience, no beat (it is not proven).
  LivenessVerdict v = Judge(p, kT0 + 2 * kLimit, proc);
  EXPECT_EQ(v.kind, Kind::kQuiet);
  EXPECT_FALSE(v.beat);
  EXPECT_EQ(Judge(p, kT0 + 2 * kLimit + milliseconds(1), proc).kind, Kind::kRetryHello);
  // Second attempt, sent at 2 limits: four more.
  p.hello_attempts = 2;
  p.hello_at = kT0 + 2 * kLimit;
  EXPECT_EQ(Judge(p, p.hello_at + 4 * kLimit, proc).kind, Kind::kQuiet);
  EXPECT_EQ(Judge(p, p.hello_at + 4 * kLimit + milliseconds(1), proc).kind, Kind::kRetryHello);
  // Past the handshake budget since last heard: blamed, with what came.
  p.hello_attempts = 4;
  p.hello_at = kT0 + 5 * kLimit;
  p.auth_refusals = 2;
  p.late_challenges = 1;
  v = Judge(p, kT0 + Peer::kHandshakeBudget * kLimit + milliseconds(500), proc);
  EXPECT_EQ(v.kind, Kind::kBlame);
  EXPECT_STREQ(v.mechanism, "handshake");
  EXPECT_NE(v.silence.find("no answer to 4 handshake attempts in 10.50 s"), std::string::npos)
      << v.silence;
  EXPECT_NE(v.silence.find("too late for the attempt they answered: 1"), std::string::npos);
  EXPECT_NE(v.silence.find("2 answers claiming to be it did not prove the shared secret"),
            std::string::npos);
}

// A challenge that checked is a sign of life (it restarts the silence), so
// a prefill rank that keeps answering challenges but never a proof would
// be retried for good: at Peer::kMaxHelloAttempts it is blamed however
// recently it was heard, and the record says its proofs got no answer.
TEST(LivenessRuleTest, AHandshakeWhoseProofsGetNoAnswerIsBlamedAtTheAttemptCap) {
  Peer p = ReadyPeer();
  p.acked = false;
  p.proofs_sent = 2;
  Proc proc{ProcessState::kRunning};
  p.hello_attempts = Peer::kMaxHelloAttempts - 1;
  p.hello_at = kT0;
  p.last_heard = kT0 + 3 * kLimit;  // its last challenge
  const SteadyTime retry = kT0 + 4 * kLimit + milliseconds(1);
  EXPECT_EQ(Judge(p, retry, proc).kind, Kind::kRetryHello);
  p.hello_attempts = Peer::kMaxHelloAttempts;
  const LivenessVerdict v = Judge(p, retry, proc);
  ASSERT_EQ(v.kind, Kind::kBlame);
  EXPECT_STREQ(v.mechanism, "handshake");
  EXPECT_NE(
      v.silence.find(fmt::format("no answer to {} handshake attempts", Peer::kMaxHelloAttempts)),
      std::string::npos)
      << v.silence;
  EXPECT_NE(v.silence.find("challenges that checked and whose proof got no answer: 2"),
            std::string::npos)
      << v.silence;
  // Before its wait is over, the last attempt still has its chance.
  EXPECT_EQ(Judge(p, kT0 + 4 * kLimit, proc).kind, Kind::kQuiet);
}

TEST(LivenessRuleTest, AnUnansweredHelloToAnExitedProcessIsBlamedAtItsFirstRetry) {
  Peer p = ReadyPeer();
  p.acked = false;
  Proc proc{ProcessState::kExited};
  const LivenessVerdict v = Judge(p, kT0 + 2 * kLimit + milliseconds(1), proc);
  EXPECT_EQ(v.kind, Kind::kBlame);
  EXPECT_EQ(v.process, ProcessState::kExited);
}

TEST(LivenessRuleTest, AFailedPeerIsNeverBlamedAgainAndBeatenOnlyIfItFailedItself) {
  Peer p = ReadyPeer();
  p.failed = true;
  FailureRecord own;
  own.cause = FailureCause::kLocalError;  // it reported its own error: alive
  p.failure = own;
  Proc proc{ProcessState::kExited};
  LivenessVerdict v = Judge(p, kT0 + 100 * kLimit, proc);
  EXPECT_EQ(v.kind, Kind::kQuiet);
  EXPECT_TRUE(v.beat);
  p.failure->cause = FailureCause::kPeerUnreachable;  // failed by us: no beat
  v = Judge(p, kT0 + 100 * kLimit, proc);
  EXPECT_EQ(v.kind, Kind::kQuiet);
  EXPECT_FALSE(v.beat);
  EXPECT_EQ(proc.asked, 0);
}

TEST(LivenessRuleTest, ARankThatFailedItselfBeatsButBlamesNobody) {
  Proc proc{ProcessState::kExited};
  const LivenessVerdict v = Judge(ReadyPeer(), kT0 + 100 * kLimit, proc, /*this_rank_failed=*/true);
  EXPECT_EQ(v.kind, Kind::kQuiet);
  EXPECT_TRUE(v.beat);
  EXPECT_EQ(proc.asked, 0);
}

TEST(LivenessRuleTest, APeerNotYetReadyIsNeitherBlamedNorRetried) {
  Peer p = ReadyPeer();
  p.ready = false;
  p.acked = false;
  Proc proc{ProcessState::kExited};
  const LivenessVerdict v = Judge(p, kT0 + 100 * kLimit, proc);
  EXPECT_EQ(v.kind, Kind::kQuiet);
  EXPECT_FALSE(v.beat);
  EXPECT_EQ(proc.asked, 0);
}

}  // namespace
}  // namespace kvbridge::internal
