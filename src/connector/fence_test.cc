// The fence for a prefill rank that fails while its writes may still be on
// their way (a partition): decode revokes the rank's write grant before it
// counts the rank's rooms quiesced, so writes released afterwards land
// nowhere.
#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "connector/connector_test_util.h"
#include "transport/fault/fault_transport.h"
#include "transport/forwarding_transport.h"
#include "transport/test_util.h"

namespace kvbridge::internal {
namespace {

// Loopback ranks, each transport wrapped in faults (prefill's first),
// liveness 50 ms x 8, and write grants for same-host prefill ranks (the
// loopback ranks share this host): admitted writes only, or with `mapping`
// a grant through which prefill maps decode's pages (a revoke cannot take
// that back).
ClusterOptions FenceCluster(std::vector<FaultTransport*>* faults, bool mapping = false) {
  ClusterOptions o;
  o.wrap = WrapInFaults(faults);
  o.tweak = [mapping](ManagerOptions& m) {
    m.heartbeat_interval = std::chrono::milliseconds(50);
    m.heartbeat_misses = 8;
    m.grant_same_host_peers = !mapping;
  };
  return o;
}

// FenceCluster with `mapping`, and a quiesce timeout no test waits for: a
// room that quiesces did so on a word about its writes, never the timeout.
ClusterOptions MappingClusterWithoutQuiesceTimeout(std::vector<FaultTransport*>* faults) {
  ClusterOptions o = FenceCluster(faults, /*mapping=*/true);
  o.tweak = [base = o.tweak](ManagerOptions& m) {
    base(m);
    m.quiesce_timeout = std::chrono::minutes(5);
  };
  return o;
}

// Prefill's writes of `r` queue, as behind a partitioned link, and then it
// goes silent: decode fails the room.
void HoldAndSilencePrefill(Request& r, FaultTransport& prefill) {
  prefill.HoldWrites();
  ASSERT_TRUE(r.senders[0]->Send(std::span(r.src).first(2)).ok());
  ASSERT_TRUE(WaitFor([&] { return prefill.HeldBatches() > 0; }));
  prefill.DropUrgentMessages(true);
  prefill.DropMessages(true);
  ASSERT_TRUE(WaitFor([&] { return r.receivers[0]->Poll() == KVPoll::kFailed; }));
}

TEST(FenceTest, SilentPrefillIsFencedAndItsHeldWritesLandNowhere) {
  std::vector<FaultTransport*> faults;  // prefill, decode
  auto c = TestCluster::Create(FenceCluster(&faults));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(faults.size(), 2u);
  Request r{.room = 21, .src = {1, 2, 3, 4}, .dst = {30, 31, 32, 33}};
  ASSERT_NO_FATAL_FAILURE(Start(**c, r, /*senders_first=*/false));
  KVReceiver& rx = *r.receivers[0];
  (*c)->decode[0].pool->Scrub(r.dst, 0x5a);
  ASSERT_NO_FATAL_FAILURE(HoldAndSilencePrefill(r, *faults[0]));
  ASSERT_TRUE(rx.Failure().has_value());
  EXPECT_EQ(rx.Failure()->origin.ShortName(), "prefill tp0");
  // Quiesced by the fence while the writes are still held, not by them.
  ASSERT_TRUE(WaitFor([&] { return rx.Quiesced(); }));
  EXPECT_GT(faults[0]->HeldBatches(), 0u);
  EXPECT_EQ(rx.PollSettled(), KVPoll::kFailed);
  faults[0]->ReleaseHeldWrites();
  ASSERT_NO_FATAL_FAILURE(BarrierBehindPrefillWrites(*faults[0], *faults[1]));
  EXPECT_TRUE((*c)->decode[0].pool->PagesHold(r.dst, 0x5a))
      << "a write of the fenced prefill rank landed after its room failed";
  EXPECT_EQ(rx.Poll(), KVPoll::kFailed);
  ASSERT_TRUE(WaitFor([&] { return r.senders[0]->Poll() == KVPoll::kFailed; }));
}

// Issue 13: the prefill rank that decode declared failed lives on (its
// messages were lost, as behind a partition). It reads the record naming
// it, fails its room, and rejoins under a new incarnation: the writes its
// old incarnation had posted land nowhere, and a new room through the same
// process succeeds, decode talking to the new incarnation under a new
// handshake.
TEST(FenceTest, DeclaredFailedPrefillRejoinsAndItsOldWritesLandNowhere) {
  std::vector<FaultTransport*> faults;  // prefill, decode
  auto c = TestCluster::Create(FenceCluster(&faults));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(faults.size(), 2u);
  KVManager& prefill = *(*c)->prefill[0].manager;
  KVManager& decode = *(*c)->decode[0].manager;
  const RankId before = ManagerAccess::Of(prefill).self();
  Request r{.room = 21, .src = {1, 2, 3, 4}, .dst = {30, 31, 32, 33}};
  ASSERT_NO_FATAL_FAILURE(Start(**c, r, /*senders_first=*/false));
  KVReceiver& rx = *r.receivers[0];
  (*c)->decode[0].pool->Scrub(r.dst, 0x5a);
  ASSERT_NO_FATAL_FAILURE(HoldAndSilencePrefill(r, *faults[0]));
  ASSERT_TRUE(WaitFor([&] { return rx.Quiesced(); }));
  // Prefill reads decode's record about it from the registry and rejoins.
  ASSERT_TRUE(WaitFor([&] { return prefill.Stats().rejoins == 1; }));
  const RankId after = ManagerAccess::Of(prefill).self();
  EXPECT_TRUE(after.SameRank(before));
  EXPECT_EQ(after.pid, before.pid);
  EXPECT_NE(after.incarnation, before.incarnation);
  // Its old room stays failed, naming its old incarnation.
  ASSERT_TRUE(WaitFor([&] { return r.senders[0]->Poll() == KVPoll::kFailed; }));
  ASSERT_TRUE(r.senders[0]->Failure().has_value());
  EXPECT_EQ(r.senders[0]->Failure()->origin.incarnation, before.incarnation);
  // What the old incarnation posted is let go only now: none of it lands.
  faults[0]->DropUrgentMessages(false);
  faults[0]->DropMessages(false);
  faults[0]->ReleaseHeldWrites();
  ASSERT_NO_FATAL_FAILURE(BarrierBehindPrefillWrites(*faults[0], *faults[1]));
  EXPECT_TRUE((*c)->decode[0].pool->PagesHold(r.dst, 0x5a))
      << "a write of the old incarnation landed after its room failed";
  EXPECT_EQ(rx.Poll(), KVPoll::kFailed);
  r.senders.clear();
  r.receivers.clear();

  // A new room through the same two processes.
  Request next{.room = 22, .src = {5, 6, 7, 8, 9}, .dst = {40, 41, 42, 43, 44}};
  ASSERT_NO_FATAL_FAILURE(Start(**c, next, /*senders_first=*/false));
  ASSERT_NO_FATAL_FAILURE(SendChunks(next, {2, 3}));
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(**c, next));
  EXPECT_TRUE((*c)->decode[0].pool->PagesHold(r.dst, 0x5a));
  bool talks_to_new = false;
  for (const PeerSnapshot& p : ManagerAccess::Of(decode).Peers())
    if (p.id.SameRank(after))
      talks_to_new =
          talks_to_new || (p.ready && !p.failed && p.id.incarnation == after.incarnation);
  EXPECT_TRUE(talks_to_new) << "decode does not talk to the new incarnation";
}

// The same rejoin, with decode's revoke of the old grant still waiting (as
// it waits for a stopped writer's admitted receives) when decode meets the
// new incarnation and replaces the peer. The old grant is revoked all the
// same, the old room quiesces, and the new incarnation's grant is not
// touched: a new room succeeds. Before, the revoke's result was kept only
// for the peer now at the position: the old room never quiesced (TSan CI
// run, DemoFault/stop_prefill).
TEST(FenceTest, ARevokeStillWaitingWhenThePeerIsReplacedFencesTheOldIncarnation) {
  std::vector<FaultTransport*> faults;  // prefill, decode
  auto c = TestCluster::Create(FenceCluster(&faults));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  KVManager& prefill = *(*c)->prefill[0].manager;
  FaultTransport& decode_faults = *faults[1];
  decode_faults.HoldRevokes(true);
  Request r{.room = 31, .src = {1, 2, 3, 4}, .dst = {30, 31, 32, 33}};
  ASSERT_NO_FATAL_FAILURE(Start(**c, r, /*senders_first=*/false));
  KVReceiver& rx = *r.receivers[0];
  ASSERT_NO_FATAL_FAILURE(HoldAndSilencePrefill(r, *faults[0]));
  ASSERT_TRUE(WaitFor([&] { return decode_faults.counters().revokes_started >= 1; }));
  ASSERT_TRUE(WaitFor([&] { return prefill.Stats().rejoins == 1; }));
  faults[0]->DropUrgentMessages(false);
  faults[0]->DropMessages(false);
  // A new room meets the new incarnation: decode replaces the peer while
  // the old grant's revoke still waits.
  Request next{.room = 32, .src = {5, 6}, .dst = {40, 41}};
  ASSERT_NO_FATAL_FAILURE(Start(**c, next, /*senders_first=*/false));
  EXPECT_FALSE(rx.Quiesced());
  decode_faults.HoldRevokes(false);
  EXPECT_TRUE(WaitFor([&] { return rx.Quiesced(); }, std::chrono::seconds(5)))
      << "the old incarnation's room never quiesced";
  faults[0]->ReleaseHeldWrites();
  ASSERT_NO_FATAL_FAILURE(SendChunks(next, {2}));
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(**c, next));
}

// Each incarnation's room is fenced by its own grant's revoke. Prefill's
// first incarnation is declared failed while decode's revoke of its grant
// times out (a write it admitted may still land); prefill rejoins, decode
// meets the new incarnation (the old grant goes to the retry list), and then
// the new incarnation fails too, its grant revoked at once. Before, that
// revoke counted the old incarnation's room quiesced as well, while the old
// grant still stood.
TEST(FenceTest, ANewerIncarnationsRevokeDoesNotQuiesceAnOlderOnesRoom) {
  std::vector<FaultTransport*> faults;  // prefill, decode
  auto c = TestCluster::Create(FenceCluster(&faults));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  KVManager& prefill = *(*c)->prefill[0].manager;
  KVManager& decode = *(*c)->decode[0].manager;
  FaultTransport& decode_faults = *faults[1];
  Request r{.room = 51, .src = {1, 2, 3, 4}, .dst = {30, 31, 32, 33}};
  ASSERT_NO_FATAL_FAILURE(Start(**c, r, /*senders_first=*/false));
  KVReceiver& rx = *r.receivers[0];
  decode_faults.FailRevokesOfGrantsSoFar(true);  // the first incarnation's grant
  ASSERT_NO_FATAL_FAILURE(HoldAndSilencePrefill(r, *faults[0]));
  ASSERT_TRUE(WaitFor([&] { return decode_faults.counters().revokes_failed >= 1; }));
  ASSERT_TRUE(WaitFor([&] { return prefill.Stats().rejoins == 1; }));
  const RankId second = ManagerAccess::Of(prefill).self();
  faults[0]->DropUrgentMessages(false);
  faults[0]->DropMessages(false);
  Request next{.room = 52, .src = {5, 6}, .dst = {40, 41}};
  ASSERT_NO_FATAL_FAILURE(Start(**c, next, /*senders_first=*/false));  // meets it
  // The second incarnation goes silent: decode fails it and revokes its
  // grant (given after the fault was set: the revoke goes through).
  faults[0]->DropUrgentMessages(true);
  faults[0]->DropMessages(true);
  auto second_fenced = [&] {
    for (const PeerSnapshot& p : ManagerAccess::Of(decode).Peers())
      if (p.id.SameRank(second) && p.id.incarnation == second.incarnation && p.fenced) return true;
    return false;
  };
  // Fenced is set under the manager's lock with the rooms it quiesces.
  ASSERT_TRUE(WaitFor(second_fenced)) << "decode never fenced the second incarnation";
  EXPECT_FALSE(rx.Quiesced()) << "the first incarnation's room quiesced on the second's revoke";
  EXPECT_TRUE(WaitFor([&] { return next.receivers[0]->Quiesced(); }));
  // Once its own grant's revoke goes through, the first room quiesces.
  decode_faults.FailRevokesOfGrantsSoFar(false);
  EXPECT_TRUE(WaitFor([&] { return rx.Quiesced(); }, std::chrono::seconds(5)))
      << "the first incarnation's room never quiesced";
}

// A same-host prefill rank that maps decode's pages (the default: it writes
// through shared memory under a grant whose revoke cannot unmap them) is
// declared failed while its writes of a room are held, and rejoins. Decode
// revokes its grant, but may count that room quiesced only once those
// writes finished: the rejoin waits for them, and decode takes the rejoined
// process's new incarnation as the word that none is left. Before, the rank
// rejoined at once, closing the sessions its Quiesced would have travelled
// on, and decode's room never quiesced (TSan CI, DemoFault/stop_prefill: "6
// failed requests never quiesced").
TEST(FenceTest, AMappingPrefillRejoinsOnlyAfterItsWritesFinishedAndItsOldRoomQuiesces) {
  std::vector<FaultTransport*> faults;  // prefill, decode
  auto c = TestCluster::Create(FenceCluster(&faults, /*mapping=*/true));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(faults.size(), 2u);
  KVManager& prefill = *(*c)->prefill[0].manager;
  Request r{.room = 31, .src = {1, 2, 3, 4}, .dst = {30, 31, 32, 33}};
  ASSERT_NO_FATAL_FAILURE(Start(**c, r, /*senders_first=*/false));
  KVReceiver& rx = *r.receivers[0];
  ASSERT_NO_FATAL_FAILURE(HoldAndSilencePrefill(r, *faults[0]));
  // Prefill hears again; it reads decode's record about it and fails its room.
  faults[0]->DropUrgentMessages(false);
  faults[0]->DropMessages(false);
  ASSERT_TRUE(WaitFor([&] { return r.senders[0]->Poll() == KVPoll::kFailed; }));
  // Barrier: decode's revoke of the grant returned, and two registry rounds
  // in which the rejoin waited for the writes.
  ASSERT_TRUE(WaitFor([&] { return faults[1]->counters().revokes_returned >= 1; }));
  ASSERT_TRUE(WaitFor([&] { return prefill.Stats().rejoin_waits >= 2; }))
      << "rejoins " << prefill.Stats().rejoins;
  EXPECT_EQ(prefill.Stats().rejoins, 0u);
  EXPECT_FALSE(rx.Quiesced()) << "quiesced while the rank's writes were still held";
  faults[0]->ReleaseHeldWrites();
  ASSERT_TRUE(WaitFor([&] { return prefill.Stats().rejoins == 1; }));
  ASSERT_TRUE(WaitFor([&] { return rx.Quiesced(); })) << "the old room never quiesced";
  // Nothing of the old incarnation lands after that.
  (*c)->decode[0].pool->Scrub(r.dst, 0x77);
  ASSERT_NO_FATAL_FAILURE(BarrierBehindPrefillWrites(*faults[0], *faults[1]));
  EXPECT_TRUE((*c)->decode[0].pool->PagesHold(r.dst, 0x77));
  r.senders.clear();
  r.receivers.clear();
  Request next{.room = 32, .src = {5, 6, 7}, .dst = {40, 41, 42}};
  ASSERT_NO_FATAL_FAILURE(Start(**c, next, /*senders_first=*/false));
  ASSERT_NO_FATAL_FAILURE(SendChunks(next, {3}));
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(**c, next));
}

// The same rejoin, with every message of the old incarnation lost until it
// rejoined: its Quiesced for the room never reaches decode. Decode learns
// that none of its writes is left only from meeting the process again under
// its new incarnation (a new room looks it up), and counts the old room
// quiesced then (write_rule.h, kRejoined), not at the quiesce timeout.
TEST(FenceTest, AMappingPrefillWhoseQuiescedWasLostQuiescesItsOldRoomWhenMetRejoined) {
  std::vector<FaultTransport*> faults;  // prefill, decode
  auto c = TestCluster::Create(MappingClusterWithoutQuiesceTimeout(&faults));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(faults.size(), 2u);
  KVManager& prefill = *(*c)->prefill[0].manager;
  Request r{.room = 33, .src = {1, 2, 3, 4}, .dst = {30, 31, 32, 33}};
  ASSERT_NO_FATAL_FAILURE(Start(**c, r, /*senders_first=*/false));
  KVReceiver& rx = *r.receivers[0];
  ASSERT_NO_FATAL_FAILURE(HoldAndSilencePrefill(r, *faults[0]));
  // Prefill reads decode's record about it, fails its room and, once its
  // held writes finished, rejoins; all it says meanwhile is lost.
  ASSERT_TRUE(WaitFor([&] { return r.senders[0]->Poll() == KVPoll::kFailed; }));
  faults[0]->ReleaseHeldWrites();
  ASSERT_TRUE(WaitFor([&] { return prefill.Stats().rejoins == 1; }));
  EXPECT_FALSE(rx.Quiesced()) << "quiesced before anything said no write is left";
  faults[0]->DropUrgentMessages(false);
  faults[0]->DropMessages(false);
  Request next{.room = 34, .src = {5, 6, 7}, .dst = {40, 41, 42}};
  ASSERT_NO_FATAL_FAILURE(Start(**c, next, /*senders_first=*/false));
  ASSERT_TRUE(WaitFor([&] { return rx.Quiesced(); })) << "the old room never quiesced";
  EXPECT_EQ(rx.PollSettled(), KVPoll::kFailed);
  ASSERT_NO_FATAL_FAILURE(SendChunks(next, {3}));
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(**c, next));
}

// Decode is the rank declared failed (it went silent) while a same-host
// prefill rank that maps its pages holds writes of a room; decode rejoins
// and meets the same prefill process again, under the incarnation it had.
// That is no word that its writes are done (a rejoin is: a new incarnation
// comes only after them): the room stays unquiesced until they finished.
// Before, meeting the same process again counted as its rejoin.
TEST(FenceTest, MeetingTheSamePrefillIncarnationAgainIsNoRejoin) {
  std::vector<FaultTransport*> faults;  // prefill, decode
  auto c = TestCluster::Create(MappingClusterWithoutQuiesceTimeout(&faults));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(faults.size(), 2u);
  KVManager& prefill = *(*c)->prefill[0].manager;
  KVManager& decode = *(*c)->decode[0].manager;
  const RankId prefill_id = ManagerAccess::Of(prefill).self();
  Request r{.room = 35, .src = {1, 2, 3, 4}, .dst = {30, 31, 32, 33}};
  ASSERT_NO_FATAL_FAILURE(Start(**c, r, /*senders_first=*/false));
  KVReceiver& rx = *r.receivers[0];
  faults[0]->KeepHeldWritesPastDisconnect(true);  // prefill closes decode's endpoint
  faults[0]->HoldWrites();
  ASSERT_TRUE(r.senders[0]->Send(std::span(r.src).first(2)).ok());
  ASSERT_TRUE(WaitFor([&] { return faults[0]->HeldBatches() > 0; }));
  faults[1]->DropUrgentMessages(true);
  faults[1]->DropMessages(true);
  ASSERT_TRUE(WaitFor([&] { return decode.Stats().rejoins == 1; })) << "decode never rejoined";
  ASSERT_TRUE(WaitFor([&] { return rx.Poll() == KVPoll::kFailed; }));
  faults[1]->DropUrgentMessages(false);
  faults[1]->DropMessages(false);
  Request next{.room = 36, .src = {5, 6, 7}, .dst = {40, 41, 42}};
  ASSERT_NO_FATAL_FAILURE(Start(**c, next, /*senders_first=*/false));  // meets it again
  ASSERT_EQ(ManagerAccess::Of(prefill).self().incarnation, prefill_id.incarnation);
  EXPECT_GT(faults[0]->HeldBatches(), 0u);
  EXPECT_FALSE(rx.Quiesced()) << "quiesced on meeting the same incarnation, its writes held";
  faults[0]->ReleaseHeldWrites();
  EXPECT_TRUE(WaitFor([&] { return rx.Quiesced(); }, std::chrono::seconds(10)))
      << "the old room never quiesced";
  ASSERT_NO_FATAL_FAILURE(SendChunks(next, {3}));
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(**c, next));
}

// Decode's transport, noting every grant decode gives.
class GrantLog final : public ForwardingTransport {
 public:
  struct Given {
    GrantId grant;
    GrantReach reach;
    std::string key;
  };
  using ForwardingTransport::ForwardingTransport;
  Result<RegisteredRegion> RegisterMemory(void* addr, size_t length, MemoryKind kind) override {
    auto r = ForwardingTransport::RegisterMemory(addr, length, kind);
    std::lock_guard<std::mutex> lock(mu_);
    if (r.ok()) own_keys_.insert(r->remote_key);
    return r;
  }
  Result<std::string> GrantRegion(RegionId region, GrantId grant, GrantReach reach) override {
    auto key = ForwardingTransport::GrantRegion(region, grant, reach);
    std::lock_guard<std::mutex> lock(mu_);
    if (key.ok()) given_.push_back({grant, reach, *key});
    return key;
  }
  std::vector<Given> given() const {
    std::lock_guard<std::mutex> lock(mu_);
    return given_;
  }
  bool IsOwnKey(const std::string& key) const {
    std::lock_guard<std::mutex> lock(mu_);
    return own_keys_.count(key) != 0;
  }

 private:
  mutable std::mutex mu_;
  std::vector<Given> given_;
  std::set<std::string> own_keys_;
};

// Issue 12: each prefill rank writes decode's pages under a token of its own,
// never the regions' own key, and a same-host one is offered a mapping
// (which its revoke cannot take back: see the test above), unless
// grant_same_host_peers asks for admitted writes only. Prefill ranks that
// have this host's name but another boot id are on another machine: they get
// admitted writes only.
enum class GrantCase { kMapping, kAdmittedOnly, kSameNameOtherMachine };
class GrantPerPeerTest : public ::testing::TestWithParam<GrantCase> {};

TEST_P(GrantPerPeerTest, EachPrefillRankWritesUnderAGrantOfItsOwn) {
  const bool admitted_only = GetParam() == GrantCase::kAdmittedOnly;
  const bool mapping = GetParam() == GrantCase::kMapping;
  GrantLog* log = nullptr;
  ClusterOptions o;
  o.prefill_tp = 2;
  if (GetParam() == GrantCase::kSameNameOtherMachine) {
    o.tweak_hooks = [](CoreHooks& h, Role role, int) {
      if (role == Role::kPrefill) h.boot_id = "00000000-0000-4000-8000-000000000002";
    };
  }
  o.wrap = [&log](std::unique_ptr<Transport> t, Role role, int) -> std::unique_ptr<Transport> {
    if (role != Role::kDecode) return t;
    auto g = std::make_unique<GrantLog>(std::move(t));
    log = g.get();
    return g;
  };
  o.tweak = [admitted_only](ManagerOptions& m) { m.grant_same_host_peers = admitted_only; };
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_NE(log, nullptr);
  Request r{.room = 41, .src = {1, 2, 3}, .dst = {10, 11, 12}};
  ASSERT_NO_FATAL_FAILURE(Start(**c, r, /*senders_first=*/false));
  ASSERT_NO_FATAL_FAILURE(SendChunks(r, {3}));
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(**c, r));  // the barrier: both wrote

  std::map<GrantId, std::set<std::string>> keys;
  for (const GrantLog::Given& g : log->given()) {
    EXPECT_EQ(g.reach,
              mapping ? Transport::GrantReach::kSameHostMapping : Transport::GrantReach::kMediated);
    EXPECT_FALSE(log->IsOwnKey(g.key)) << "a region's own key was handed out";
    keys[g.grant].insert(g.key);
  }
  ASSERT_EQ(keys.size(), 2u) << "one grant per prefill rank";
  for (const std::string& k : keys.begin()->second)
    EXPECT_EQ(std::next(keys.begin())->second.count(k), 0u) << "two ranks share a key";
}

INSTANTIATE_TEST_SUITE_P(Reach, GrantPerPeerTest,
                         ::testing::Values(GrantCase::kMapping, GrantCase::kAdmittedOnly,
                                           GrantCase::kSameNameOtherMachine),
                         [](const auto& info) {
                           switch (info.param) {
                             case GrantCase::kMapping:
                               return "mapping";
                             case GrantCase::kAdmittedOnly:
                               return "admitted";
                             case GrantCase::kSameNameOtherMachine:
                               return "same_name_other_machine";
                           }
                           return "unknown";
                         });

// Prefill's transport, whose next PostWrites waits at a gate until opened:
// a chunk the engine took is not yet handed to the transport, so nothing
// sent meanwhile queues behind it.
class GatedWrites final : public ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  Status PostWrites(PeerId peer, std::vector<WriteOp> ops, WriteCallback done) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (closed_) {
        ++waiting_;
        cv_.wait(lock, [&] { return !closed_; });
        --waiting_;
      }
    }
    return ForwardingTransport::PostWrites(peer, std::move(ops), std::move(done));
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = false;
    }
    cv_.notify_all();
  }
  int Waiting() const {
    std::lock_guard<std::mutex> lock(mu_);
    return waiting_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  int waiting_ = 0;
};

// sglang (and the worker) releases a failed sender at once. A chunk of it
// may still be on its way: taken by the engine, behind another request's
// write. Decode's own notice of the room's failure, sent before, may reach
// prefill only after the release; prefill must answer it "quiesced" only
// once that chunk finished. Before, it found no sender, answered at once,
// and decode gave the pages back while the chunk was still to land (CI,
// KillPrefillTest/4 under ASan: "page N was written after room 48 failed
// and quiesced").
TEST(FenceTest, AReleasedSenderAnswersQuiescedOnlyOnceItsChunksFinished) {
  std::vector<FaultTransport*> faults;  // prefill, decode
  GatedWrites* gate = nullptr;
  ClusterOptions o;
  o.wrap = [&faults, &gate](std::unique_ptr<Transport> t, Role role,
                            int) -> std::unique_ptr<Transport> {
    auto f = std::make_unique<FaultTransport>(std::move(t));
    faults.push_back(f.get());
    if (role != Role::kPrefill) return f;
    auto g = std::make_unique<GatedWrites>(std::move(f));
    gate = g.get();
    return g;
  };
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(faults.size(), 2u);
  ASSERT_NE(gate, nullptr);
  Request ahead{.room = 40, .src = {1, 2}, .dst = {20, 21}};
  Request r{.room = 41, .src = {3, 4, 5, 6}, .dst = {30, 31, 32, 33}};
  ASSERT_NO_FATAL_FAILURE(Start(**c, ahead, /*senders_first=*/false));
  ASSERT_NO_FATAL_FAILURE(Start(**c, r, /*senders_first=*/false));
  KVReceiver& rx = *r.receivers[0];
  // Room 40's chunk waits at the gate, inline on this thread of its own;
  // room 41's chunk then queues in the engine behind it.
  gate->Close();
  std::thread blocked([&] {
    ahead.senders[0]->Send(std::span(ahead.src), std::span(ahead.src_state)).IgnoreError();
  });
  struct Join {
    GatedWrites& gate;
    std::thread& thread;
    ~Join() {
      gate.Open();
      thread.join();
    }
  } join{*gate, blocked};
  ASSERT_TRUE(WaitFor([&] { return gate->Waiting() == 1; }));
  ASSERT_TRUE(r.senders[0]->Send(std::span(r.src).first(2)).ok());
  // Decode aborts the room; its notice waits until prefill released its
  // sender (which fails the room there too).
  faults[1]->HoldMessages();
  rx.Abort();
  ASSERT_TRUE(WaitFor([&] { return faults[1]->HeldMessages() > 0; }));
  r.senders.clear();
  faults[1]->ReleaseHeldMessages();
  // Barrier, both ways: prefill read decode's notice before the next
  // request's metadata, and decode reads any answer before prefill's
  // notice of that request's abort.
  Request next{.room = 42, .src = {7}, .dst = {40}};
  ASSERT_NO_FATAL_FAILURE(Start(**c, next, /*senders_first=*/false));
  next.senders[0]->Abort();
  ASSERT_TRUE(WaitFor([&] { return next.receivers[0]->Poll() == KVPoll::kFailed; }));
  EXPECT_FALSE(rx.Quiesced()) << "quiesced while a chunk of the room was still to be written";
  gate->Open();
  ASSERT_TRUE(WaitFor([&] { return rx.Quiesced(); })) << "the room never quiesced";
  // Nothing of the room lands after that.
  (*c)->decode[0].pool->Scrub(r.dst, 0x77);
  ASSERT_NO_FATAL_FAILURE(BarrierBehindPrefillWrites(*faults[0], *faults[1]));
  EXPECT_TRUE((*c)->decode[0].pool->PagesHold(r.dst, 0x77));
}

}  // namespace
}  // namespace kvbridge::internal
