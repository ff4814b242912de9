// A rank the others failed that lives on (it was stopped, or its messages
// were lost) rejoins under sglang's own bootstrap server too (issue 13).
// kvbridge's registry and etcd tell such a rank it was fenced; sglang's
// server keeps no records, so before, nothing told it: the decode rank that
// failed a stopped prefill rank refused every later request naming it ("failed
// and has not restarted"), the prefill rank waited for metadata that never
// came, and the pair stayed apart until one was restarted. Now the rank that
// failed it answers the first thing it says with the record, it fences
// itself, rejoins as a new incarnation, and new requests through the same
// two processes succeed. Time is scripted (manual ticks): the silence is
// exactly the limit plus one round, with no sleep.
#include <gtest/gtest.h>

#include "connector/connector_test_util.h"

namespace kvbridge::internal {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr milliseconds kInterval{100};
constexpr int kMisses = 5;

// The stopped rank is prefill or decode (the parameter); the other fails it.
class SglangServerRejoinTest : public ::testing::TestWithParam<Role> {};

TEST_P(SglangServerRejoinTest, AStoppedRankIsToldItFailedRejoinsAndServesAgain) {
  auto clock = std::make_shared<ManualClock>();
  std::atomic<ProcessState> proc{ProcessState::kRunning};
  ClusterOptions o;
  o.sglang_server = true;
  o.hooks.clock = clock;
  o.hooks.manual_ticks = true;
  o.hooks.process_state = [&proc](int) { return proc.load(); };
  o.tweak = [](ManagerOptions& m) {
    m.heartbeat_interval = kInterval;
    m.heartbeat_misses = kMisses;
  };
  auto made = TestCluster::Create(o);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  TestCluster& c = **made;
  ManagerImpl& prefill = ManagerAccess::Of(*c.prefill[0].manager);
  ManagerImpl& decode = ManagerAccess::Of(*c.decode[0].manager);
  const bool prefill_stops = GetParam() == Role::kPrefill;
  ManagerImpl& victim = prefill_stops ? prefill : decode;
  ManagerImpl& judge = prefill_stops ? decode : prefill;

  Request first{.room = 1, .src = {1, 2}, .dst = {3, 4}};
  ASSERT_NO_FATAL_FAILURE(Start(c, first, false));
  ASSERT_NO_FATAL_FAILURE(SendChunks(first, {2}));
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(c, first));
  const RankId old = victim.self();

  // The victim is stopped (so /proc says) and silent while the other runs
  // its rounds: it is failed one round past the silence limit.
  proc = ProcessState::kStopped;
  for (int i = 0; i <= kMisses; ++i) {
    clock->Advance(kInterval);
    judge.TickNow();
  }
  auto seen = PeerAt(judge, old);
  ASSERT_TRUE(seen && seen->failed) << old.ShortName() << " was not failed";
  ASSERT_EQ(victim.Stats().rejoins, 0u);

  // It runs again: its round's heartbeat reaches the judge, which answers
  // with its record; the victim fences itself and rejoins (on its registry
  // thread).
  proc = ProcessState::kRunning;
  clock->Advance(kInterval);
  victim.TickNow();
  ASSERT_TRUE(WaitFor([&] { return victim.Stats().rejoins == 1; }, seconds(10)))
      << old.ShortName() << " was never told it was failed";
  EXPECT_NE(victim.self().incarnation, old.incarnation);
  EXPECT_TRUE(victim.self().SameRank(old));
  EXPECT_EQ(judge.Stats().rejoins, 0u);
  // Its next round meets the other again as the new incarnation: a decode
  // rank makes the handshake itself (sglang's server does not list it); a
  // prefill rank is met by decode's next lookup, which finds the new
  // incarnation at its rank_port.
  clock->Advance(kInterval);
  victim.TickNow();
  if (!prefill_stops) {
    ASSERT_TRUE(WaitFor([&] {
      auto p = PeerAt(judge, old);
      return p && p->ready && !p->failed && p->id.incarnation == victim.self().incarnation;
    })) << "prefill never met decode's new incarnation";
  }

  // A new request through the same two processes succeeds.
  Request second{.room = 2, .src = {5, 6}, .dst = {7, 8}};
  ASSERT_NO_FATAL_FAILURE(Start(c, second, false));
  ASSERT_NO_FATAL_FAILURE(SendChunks(second, {2}));
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(c, second));
  EXPECT_EQ(victim.Stats().rejoins, 1u);
  // Prefill registered once, and again when it rejoined; decode ranks are
  // not listed on sglang's server.
  EXPECT_EQ(c.sglang_server->registrations(), prefill_stops ? 2 : 1);
}

INSTANTIATE_TEST_SUITE_P(Victim, SglangServerRejoinTest,
                         ::testing::Values(Role::kPrefill, Role::kDecode),
                         [](const auto& info) { return std::string(RoleName(info.param)); });

// The notice is a power a peer already has through kvbridge's registry (a
// record about a rank of the other role), and no more: a proven decode rank
// fences a prefill rank only with a rank failure that names that process
// (its incarnation now) and the sender itself as the detector. Anything
// else is dropped and counted, and fences nobody.
TEST(SglangServerNoticeTest, OnlyTheDetectorFencesAndOnlyTheProcessItNames) {
  ClusterOptions o;
  o.sglang_server = true;
  auto made = TestCluster::Create(o);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  TestCluster& c = **made;
  KVManager& prefill = *c.prefill[0].manager;
  KVManager& decode = *c.decode[0].manager;
  Request first{.room = 1, .src = {1, 2}, .dst = {3, 4}};
  ASSERT_NO_FATAL_FAILURE(Start(c, first, false));
  ASSERT_NO_FATAL_FAILURE(SendChunks(first, {2}));
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(c, first));

  const RankId p = prefill.self(), d = decode.self();
  auto notice = [&](RankId origin, RankId detector, FailureCause cause) {
    FailureRecord r;
    r.origin = origin;
    r.detected_by = detector;
    r.cause = cause;
    r.detail = "test";
    r.mechanism = "test";
    return EncodeMessage(d, RankFailedMsg{r});
  };
  RankId other_decode = d;
  other_decode.tp = 1;
  RankId old_prefill = p;
  old_prefill.incarnation += 1;
  Transport& dt = ManagerAccess::Of(decode).transport();
  const PeerId to_prefill = ProvenEndpoint(decode, p);
  const uint64_t dropped = prefill.Stats().unauthenticated_messages_dropped;
  for (const std::string& bad :
       {notice(p, other_decode, FailureCause::kPeerUnresponsive),  // not the sender's finding
        notice(old_prefill, d, FailureCause::kPeerUnreachable),    // another incarnation
        notice(p, d, FailureCause::kInvalidRequest)})              // not a rank failure
    ASSERT_TRUE(dt.SendMessage(to_prefill, bad).ok());
  ASSERT_TRUE(WaitFor([&] {
    return prefill.Stats().unauthenticated_messages_dropped == dropped + 3;
  })) << prefill.Stats().unauthenticated_messages_dropped - dropped;
  Request second{.room = 2, .src = {5, 6}, .dst = {7, 8}};
  ASSERT_NO_FATAL_FAILURE(Start(c, second, false));
  ASSERT_NO_FATAL_FAILURE(SendChunks(second, {2}));
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(c, second));
  EXPECT_EQ(prefill.Stats().rejoins, 0u);

  // The detector's own word about this very process is taken.
  ASSERT_TRUE(dt.SendMessage(to_prefill, notice(p, d, FailureCause::kPeerUnresponsive)).ok());
  EXPECT_TRUE(WaitFor([&] { return prefill.Stats().rejoins == 1; }, seconds(10)));
  EXPECT_NE(prefill.self().incarnation, p.incarnation);
}

}  // namespace
}  // namespace kvbridge::internal
