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
  // Its record is for peers to tell: none waits for sglang's server.
  EXPECT_EQ(judge.Stats().failure_records_unpublished, 0u);

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

// Across hosts (another boot id: no /proc, no shared memory between them), a
// partition makes each side fail the other as unreachable and close the
// session at once, so that nothing queued lands after it heals. With
// sglang's server nothing then told either rank: decode refused every
// later request naming the prefill rank ("failed and has not restarted")
// until one was restarted. Now, once the prefill rank's endpoint answers
// again, decode makes a handshake only to tell it. Of the two, the one the
// other failed first is fenced and rejoins (as a registry would have it),
// and the other keeps its incarnation. The parameter is the side that goes
// silent first; the other follows once it has been failed. The writes
// prefill's old session had queued land nowhere.
class SglangServerPartitionTest : public ::testing::TestWithParam<Role> {};

// `first` (a rank's transport) goes silent until `victim` is failed by the
// other side, then `second` too until the other side is failed by `victim`.
void CutApart(FaultTransport& first, FaultTransport& second, ManagerImpl& victim,
              ManagerImpl& other) {
  const RankId v = victim.self(), o = other.self();
  first.DropUrgentMessages(true);
  first.DropMessages(true);
  ASSERT_TRUE(WaitFor([&] {
    auto p = PeerAt(other, v);
    return p && p->failed;
  })) << v.ShortName()
      << " was not failed";
  second.DropUrgentMessages(true);
  second.DropMessages(true);
  ASSERT_TRUE(WaitFor([&] {
    auto p = PeerAt(victim, o);
    return p && p->failed;
  })) << "the two sides did not fail each other";
}

TEST_P(SglangServerPartitionTest, TheRankFailedFirstIsToldOnceItsHostAnswersAndServesAgain) {
  std::vector<FaultTransport*> faults;  // prefill, decode
  ClusterOptions o;
  o.sglang_server = true;
  o.wrap = WrapInFaults(&faults);
  o.tweak = [](ManagerOptions& m) {
    m.heartbeat_interval = milliseconds(50);
    m.heartbeat_misses = 8;
  };
  o.tweak_hooks = [](CoreHooks& h, Role role, int) {
    if (role == Role::kDecode) h.boot_id = "00000000-0000-4000-8000-00000000000d";
  };
  auto made = TestCluster::Create(o);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  TestCluster& c = **made;
  ASSERT_EQ(faults.size(), 2u);
  ManagerImpl& prefill = ManagerAccess::Of(*c.prefill[0].manager);
  ManagerImpl& decode = ManagerAccess::Of(*c.decode[0].manager);
  const bool prefill_first = GetParam() == Role::kPrefill;
  ManagerImpl& fenced = prefill_first ? prefill : decode;
  ManagerImpl& kept = prefill_first ? decode : prefill;
  const RankId fenced_old = fenced.self(), kept_old = kept.self();

  // A request whose writes queue behind the partition.
  Request cut{.room = 1, .src = {1, 2, 3, 4}, .dst = {30, 31, 32, 33}};
  ASSERT_NO_FATAL_FAILURE(Start(c, cut, false));
  c.decode[0].pool->Scrub(cut.dst, 0x5a);
  faults[0]->HoldWrites();
  ASSERT_TRUE(cut.senders[0]->Send(std::span(cut.src).first(2)).ok());
  ASSERT_TRUE(WaitFor([&] { return faults[0]->HeldBatches() > 0; }));
  ASSERT_NO_FATAL_FAILURE(
      CutApart(*faults[prefill_first ? 0 : 1], *faults[prefill_first ? 1 : 0], fenced, kept));
  ASSERT_TRUE(WaitFor([&] { return cut.receivers[0]->Poll() == KVPoll::kFailed; }));
  ASSERT_TRUE(WaitFor([&] { return cut.senders[0]->Poll() == KVPoll::kFailed; }));
  // Each side names a rank of the pair as unreachable (prefill may hold
  // decode's finding about itself, which came before its own).
  for (const auto& failure : {cut.receivers[0]->Failure(), cut.senders[0]->Failure()}) {
    ASSERT_TRUE(failure.has_value());
    EXPECT_EQ(failure->cause, FailureCause::kPeerUnreachable) << failure->Message();
    EXPECT_TRUE(failure->origin.SameRank(fenced_old) || failure->origin.SameRank(kept_old))
        << failure->Message();
  }
  EXPECT_EQ(cut.receivers[0]->Failure()->origin.ShortName(), "prefill tp0");
  ASSERT_TRUE(WaitFor([&] { return cut.receivers[0]->Quiesced(); }));

  // The partition heals. The rank failed first is told, fences itself and
  // rejoins; the other keeps its incarnation.
  for (FaultTransport* f : faults) {
    f->DropUrgentMessages(false);
    f->DropMessages(false);
  }
  ASSERT_TRUE(WaitFor([&] { return fenced.Stats().rejoins == 1; }))
      << fenced_old.ShortName() << " was never told it was failed";
  EXPECT_TRUE(fenced.self().SameRank(fenced_old));
  EXPECT_NE(fenced.self().incarnation, fenced_old.incarnation);
  // A decode rank that rejoined meets prefill again itself (sglang's server
  // does not list it); until then prefill fails its instance's requests.
  if (!prefill_first) {
    ASSERT_TRUE(WaitFor([&] {
      auto p = PeerAt(prefill, fenced_old);
      return p && p->ready && !p->failed && p->id.incarnation == decode.self().incarnation;
    })) << "prefill never met decode's new incarnation";
  }

  // What prefill's old session queued lands nowhere.
  faults[0]->ReleaseHeldWrites();
  ASSERT_NO_FATAL_FAILURE(BarrierBehindPrefillWrites(*faults[0], *faults[1]));
  EXPECT_TRUE(c.decode[0].pool->PagesHold(cut.dst, 0x5a))
      << "a write of prefill's fenced session landed after its room failed";

  // A new request through the same two processes succeeds.
  Request next{.room = 2, .src = {5, 6}, .dst = {7, 8}};
  ASSERT_NO_FATAL_FAILURE(Start(c, next, false));
  ASSERT_NO_FATAL_FAILURE(SendChunks(next, {2}));
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(c, next));
  EXPECT_EQ(fenced.Stats().rejoins, 1u);
  EXPECT_EQ(kept.Stats().rejoins, 0u);
  EXPECT_EQ(kept.self().incarnation, kept_old.incarnation);
  // Prefill registers again only when it is the one that rejoined.
  EXPECT_EQ(c.sglang_server->registrations(), prefill_first ? 2 : 1);
}

INSTANTIATE_TEST_SUITE_P(SilentFirst, SglangServerPartitionTest,
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

// sglang's server keeps no failure records, so none is queued for it: the
// ranks tell each other. Before, each failure's record was queued for a
// publish that never came, held for the life of the process, and from the
// 1025th on every failure logged that records were waiting for the
// registry. Here an abort on each side reaches the other (the barrier)
// and neither rank has a record waiting.
TEST(SglangServerRecordsTest, NoRecordWaitsForAServerThatKeepsNone) {
  ClusterOptions o;
  o.sglang_server = true;
  auto made = TestCluster::Create(o);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  TestCluster& c = **made;
  Request by_decode{.room = 1, .src = {1, 2}, .dst = {3, 4}};
  Request by_prefill{.room = 2, .src = {5, 6}, .dst = {7, 8}};
  ASSERT_NO_FATAL_FAILURE(Start(c, by_decode, false));
  ASSERT_NO_FATAL_FAILURE(Start(c, by_prefill, false));
  by_decode.receivers[0]->Abort();
  by_prefill.senders[0]->Abort();
  KVSender& told = *by_decode.senders[0];
  ASSERT_TRUE(WaitFor([&] { return told.Poll() == KVPoll::kFailed; }));
  EXPECT_EQ(told.Failure()->cause, FailureCause::kAborted);
  ASSERT_TRUE(WaitFor([&] { return by_prefill.receivers[0]->Poll() == KVPoll::kFailed; }));
  EXPECT_EQ(by_prefill.receivers[0]->Failure()->cause, FailureCause::kAborted);
  EXPECT_EQ(c.prefill[0].manager->Stats().failure_records_unpublished, 0u);
  EXPECT_EQ(c.decode[0].manager->Stats().failure_records_unpublished, 0u);
}

}  // namespace
}  // namespace kvbridge::internal
