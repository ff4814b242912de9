// Manager metrics and a restarted rank, over the loopback transport.
#include <gtest/gtest.h>
#include <httplib.h>

#include <sstream>

#include "connector/connector_test_util.h"
#include "connector/registry_test_util.h"
#include "connector/stall_proxy.h"
#include "connector/test_cluster.h"
#include "control/auth.h"
#include "control/bootstrap_client.h"
#include "control/record_json.h"

namespace kvbridge::internal {
namespace {

// Runs one request from prefill[0] to decode[0] until its receiver reaches
// `expect`; `keep`, if given, takes that receiver.
void Transfer(TestCluster& c, uint64_t room, KVPoll expect = KVPoll::kSuccess,
              std::unique_ptr<KVReceiver>* keep = nullptr) {
  std::vector<int32_t> src{1, 2, 3}, dst{7, 8, 9};
  auto rx = std::move(KVReceiver::Create(*c.decode[0].manager, room)).value();
  auto tx = std::move(KVSender::Create(*c.prefill[0].manager, room)).value();
  c.prefill[0].pool->Fill(room, src, 0, {});
  ASSERT_TRUE(rx->Init(0).ok());
  ASSERT_TRUE(rx->SendMetadata(dst, 0, {}).ok());
  ASSERT_TRUE(WaitFor([&] { return tx->Poll() == KVPoll::kWaitingForInput; }))
      << KVPollName(tx->Poll());
  ASSERT_TRUE(tx->Init(3, 0).ok());
  ASSERT_TRUE(tx->Send(src).ok());
  ASSERT_TRUE(WaitFor([&] { return rx->Poll() == expect; }));
  EXPECT_EQ(c.decode[0].pool->CountCorruptPages(room, dst), 0u);
  if (keep != nullptr) *keep = std::move(rx);
}

// A new process at `role` tp `tp`'s position: a manager with `mo` (the
// options of the one that went) on a new loopback endpoint, so a new
// incarnation.
void Restart(TestCluster& c, Role role, int tp, const ManagerOptions& mo) {
  const std::string name = std::string(RoleName(role)) + " tp" + std::to_string(tp);
  auto restarted = CreateManager(
      mo, std::move(CreateLoopbackTransport(c.fabric(), name + " (restarted)")).value());
  ASSERT_TRUE(restarted.ok()) << restarted.status().ToString();
  (role == Role::kPrefill ? c.prefill : c.decode)[tp].manager = std::move(restarted).value();
}

double Scrape(int port, const std::string& name, const std::string& labels_have) {
  httplib::Client cli("127.0.0.1", port);
  auto res = cli.Get("/metrics");
  EXPECT_TRUE(res && res->status == 200);
  if (!res) return -1;
  std::istringstream in(res->body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + "{", 0) != 0 && line.rfind(name + " ", 0) != 0) continue;
    if (line.find(labels_have) == std::string::npos) continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  ADD_FAILURE() << name << " with " << labels_have << " not in:\n" << res->body;
  return -1;
}

TEST(ManagerMetricsTest, ScrapedCountersFollowTransfers) {
  ClusterOptions o;
  o.tweak = [](ManagerOptions& m) { m.metrics_port = -1; };
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const int port = (*c)->prefill[0].manager->metrics_port();
  ASSERT_GT(port, 0);
  EXPECT_EQ(Scrape(port, "kvbridge_transfers_total", "result=\"success\""), 0);
  Transfer(**c, 1);
  Transfer(**c, 2);
  ASSERT_TRUE(WaitFor([&] { return (*c)->prefill[0].manager->Stats().rooms_succeeded == 2; }));
  EXPECT_EQ(Scrape(port, "kvbridge_transfers_total", "result=\"success\""), 2);
  EXPECT_GT(Scrape(port, "kvbridge_transfer_bytes_total", "role=\"prefill\""), 0);
  EXPECT_EQ(Scrape(port, "kvbridge_request_latency_seconds_count", "role=\"prefill\""), 2);
  EXPECT_EQ(Scrape(port, "kvbridge_peers", "state=\"connected\""), 1);
  // A failure shows up by cause.
  auto tx = std::move(KVSender::Create(*(*c)->prefill[0].manager, 3)).value();
  tx->Abort();
  EXPECT_EQ(Scrape(port, "kvbridge_failures_total", "cause=\"aborted\""), 1);
}

TEST(RestartTest, RestartedPrefillRankServesNewRequestsThroughANewEndpoint) {
  ClusterOptions o;
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Transfer(**c, 1);
  const uint64_t old_incarnation = (*c)->prefill[0].manager->self().incarnation;
  // The prefill rank goes away (its transport with it) and comes back at
  // the same position as a new incarnation.
  ManagerOptions mo = (*c)->prefill[0].manager->options();
  (*c)->prefill[0].manager.reset();
  ASSERT_TRUE(WaitFor([&] { return (*c)->decode[0].manager->Stats().peers_connected == 0; }));
  ASSERT_NO_FATAL_FAILURE(Restart(**c, Role::kPrefill, 0, mo));
  EXPECT_NE((*c)->prefill[0].manager->self().incarnation, old_incarnation);
  Transfer(**c, 2);  // the stale endpoint is not reused: this would hang
  EXPECT_EQ((*c)->decode[0].manager->Stats().peers_connected, 1u);
}

// One request through every rank: a receiver on each decode rank, a sender
// on each prefill rank; all must reach Success with intact pages.
void TransferAll(TestCluster& c, uint64_t room) {
  Request r{.room = room};
  r.src = {1, 2, 3};
  r.dst = {7, 8, 9};
  Start(c, r, false);
  SendChunks(r, {3});
  ExpectDelivered(c, r);
}

// prefill tp2 -> decode tp1: prefill tp1 has a sibling to blame or spare.
ClusterOptions TwoPrefillsOneDecode() {
  ClusterOptions o;
  o.prefill_tp = 2;
  o.decode_tp = 1;
  o.tweak = TolerantLiveness;
  return o;
}

// A dead sibling blocks new requests on its instance: each fails naming it
// once the registry thread's restart check shows it has not restarted.
// Once it restarted at the same position, the very next request goes
// through: the check finds the new process, without waiting for the next
// liveness sweep of the registry.
TEST(RestartTest, RestartedSiblingNoLongerBlocksNewRequests) {
  auto c = TestCluster::Create(TwoPrefillsOneDecode());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  TransferAll(**c, 1);
  const RankId old_self = (*c)->prefill[1].manager->self();
  ManagerOptions mo = (*c)->prefill[1].manager->options();
  (*c)->prefill[1].manager.reset();
  // Decode sees the transport go; its sibling learns through the registry
  // and then fails each new request, naming the dead process.
  KVManager& sibling = *(*c)->prefill[0].manager;
  ASSERT_TRUE(WaitFor([&] { return sibling.RecentRankFailure().has_value(); }));
  uint64_t room = 100;
  auto tx = std::move(KVSender::Create(sibling, ++room)).value();
  ASSERT_TRUE(WaitFor([&] { return tx->Poll() == KVPoll::kFailed; }));
  EXPECT_TRUE(tx->Failure()->origin.SameRank(old_self)) << tx->Failure()->Message();
  EXPECT_EQ(tx->Failure()->origin.pid, old_self.pid);
  ASSERT_NO_FATAL_FAILURE(Restart(**c, Role::kPrefill, 1, mo));
  // Straight after registration: its check finds the new process.
  tx = std::move(KVSender::Create(sibling, ++room)).value();
  ASSERT_TRUE(WaitFor([&] { return sibling.Stats().rooms_awaiting_restart_check == 0; }));
  EXPECT_NE(tx->Poll(), KVPoll::kFailed) << tx->Failure()->Message();
  tx.reset();
  TransferAll(**c, ++room);
}

// The same on decode: a dead decode sibling blocks new receivers (each
// fails naming it after its restart check); its restart unblocks them.
TEST(RestartTest, RestartedDecodeSiblingNoLongerBlocksNewReceivers) {
  ClusterOptions o;
  o.prefill_tp = 1;
  o.decode_tp = 2;
  o.tweak = TolerantLiveness;
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  TransferAll(**c, 1);  // prefill meets both decode ranks
  const RankId old_self = (*c)->decode[1].manager->self();
  ManagerOptions mo = (*c)->decode[1].manager->options();
  (*c)->decode[1].manager.reset();
  // Prefill sees the transport go and publishes it; decode tp0 reads it.
  KVManager& sibling = *(*c)->decode[0].manager;
  ASSERT_TRUE(WaitFor([&] { return sibling.RecentRankFailure().has_value(); }));
  uint64_t room = 100;
  auto rx = std::move(KVReceiver::Create(sibling, ++room)).value();
  ASSERT_TRUE(WaitFor([&] { return rx->Poll() == KVPoll::kFailed; }));
  EXPECT_TRUE(rx->Failure()->origin.SameRank(old_self)) << rx->Failure()->Message();
  EXPECT_EQ(rx->Failure()->origin.pid, old_self.pid);
  ASSERT_NO_FATAL_FAILURE(Restart(**c, Role::kDecode, 1, mo));
  rx = std::move(KVReceiver::Create(sibling, ++room)).value();
  ASSERT_TRUE(WaitFor([&] { return sibling.Stats().rooms_awaiting_restart_check == 0; }));
  EXPECT_NE(rx->Poll(), KVPoll::kFailed) << rx->Failure()->Message();
  rx.reset();
  TransferAll(**c, ++room);
}

// Success is final, so a request awaiting its restart check must not reach
// it before the check: the check may still fail it. Here decode tp0 has
// read that its sibling decode tp1 died (a record published for the test;
// tp1 lives on); prefill, which reads the registry through a stalled proxy,
// knows nothing of it and sends the request whole. Decode tp0's check,
// behind a stalled proxy too, fails when its read times out (2 s), naming
// tp1. Before, the receiver took Success from prefill's last notice while
// its check was pending, and the check could no longer fail it.
TEST(RestartTest, AReceiverAwaitingItsRestartCheckDoesNotSucceedBeforeIt) {
  std::unique_ptr<StallProxy> near, far;  // decode tp0's registry; the others'
  ClusterOptions o;
  o.prefill_tp = 1;
  o.decode_tp = 2;
  o.tweak = [&](ManagerOptions& m) {
    TolerantLiveness(m);
    m.heartbeat_misses = 400;  // no rank counts the registry lost within 20 s
    if (!near) {
      near = std::make_unique<StallProxy>(m.bootstrap_addr);
      far = std::make_unique<StallProxy>(m.bootstrap_addr);
    }
    const bool reader = m.role == Role::kDecode && m.parallel.tp_rank == 0;
    m.bootstrap_addr = (reader ? near : far)->address();
  };
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(near && near->ok() && far && far->ok());
  TransferAll(**c, 1);  // decode tp0 knows its sources: no lookup needed
  far->Stall();
  KVManager& decode = *(*c)->decode[0].manager;
  const RankId sibling = (*c)->decode[1].manager->self();
  ASSERT_NO_FATAL_FAILURE(PublishDeath((*c)->bootstrap_address(), decode.self(), DeathOf(sibling)));
  ASSERT_TRUE(WaitFor([&] { return decode.RecentRankFailure().has_value(); }));
  ASSERT_TRUE(decode.RecentRankFailure()->origin.SameRank(sibling));
  near->Stall();
  Request r{.room = 2};
  r.src = {1, 2, 3};
  r.dst = {7, 8, 9};
  Start(**c, r, false);
  ASSERT_EQ(decode.Stats().rooms_awaiting_restart_check, 1u);
  SendChunks(r, {3});
  // Prefill, which knows of no death, delivers everything.
  ASSERT_TRUE(WaitFor([&] { return r.senders[0]->Poll() == KVPoll::kSuccess; }))
      << KVPollName(r.senders[0]->Poll());
  KVReceiver& held = *r.receivers[0];
  ASSERT_TRUE(WaitFor([&] { return held.Poll() == KVPoll::kFailed; }, std::chrono::seconds(30)))
      << "decode tp0 ended " << KVPollName(held.Poll())
      << ", which its restart check could not undo";
  EXPECT_TRUE(held.Failure()->origin.SameRank(sibling)) << held.Failure()->Message();
  near->Resume();  // the managers deregister through them
  far->Resume();
}

// A failure record about a process that was already replaced at its
// position (read late from the registry, or from a slow detector) names a
// process no live request involves: it fails nothing, on the sibling or on
// decode, and is counted as stale.
TEST(RestartTest, LateRecordAboutAReplacedProcessFailsNoLiveRequest) {
  auto c = TestCluster::Create(TwoPrefillsOneDecode());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  TransferAll(**c, 1);
  KVManager& sibling = *(*c)->prefill[0].manager;
  KVManager& decode = *(*c)->decode[0].manager;
  // A request in flight on every rank when the late record comes.
  Request r{.room = 2};
  r.src = {1, 2, 3};
  r.dst = {7, 8, 9};
  Start(**c, r, false);
  // prefill tp1's previous process (an incarnation the ranks never heard
  // of) exited; the record of it reaches the registry only now.
  RankId gone = (*c)->prefill[1].manager->self();
  gone.incarnation ^= 0x5a5a5a5a5a5a5a5aull;
  gone.pid += 1;
  const uint64_t sibling_stale = sibling.Stats().stale_messages_dropped;
  const uint64_t decode_stale = decode.Stats().stale_messages_dropped;
  ASSERT_NO_FATAL_FAILURE(
      PublishDeath(sibling.options().bootstrap_addr, decode.self(), DeathOf(gone)));
  ASSERT_TRUE(WaitFor([&] {
    return sibling.Stats().stale_messages_dropped > sibling_stale &&
           decode.Stats().stale_messages_dropped > decode_stale;
  })) << "the late record was not read as stale";
  for (auto& t : r.senders) ASSERT_NE(t->Poll(), KVPoll::kFailed) << t->Failure()->Message();
  SendChunks(r, {3});
  ExpectDelivered(**c, r);
  TransferAll(**c, 3);  // and new requests are not blocked by it either
}

// prefill tp2 -> decode tp2: decode tp0 reads from prefill tp0 only. Decode
// tp0 fails a request at once while its prefill instance has a dead rank
// (prefill tp1), before it has resolved the request's sources. Once prefill
// tp1 restarted, prefill tp0 takes the same request unblocked: it must learn
// decode's reason at once. Before, decode told no prefill rank about a
// request that failed before its sources were known, and prefill tp0 waited
// for metadata until its deadline, blaming itself (TSan CI run,
// DemoFault/stop_prefill).
TEST(RestartTest, ARequestDecodeFailedBeforeResolvingItsSourcesReachesPrefill) {
  ClusterOptions o;
  o.prefill_tp = 2;
  o.decode_tp = 2;
  o.tweak = [](ManagerOptions& m) {
    TolerantLiveness(m);
    m.waiting_timeout = std::chrono::minutes(5);  // no deadline can fail it in this test
  };
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  TransferAll(**c, 1);
  const RankId dead = (*c)->prefill[1].manager->self();
  ManagerOptions mo = (*c)->prefill[1].manager->options();
  (*c)->prefill[1].manager.reset();
  // decode tp1 sees the transport go; decode tp0 learns it through the
  // registry and then fails new requests of that instance at once.
  KVManager& decode = *(*c)->decode[0].manager;
  uint64_t room = 100;
  std::unique_ptr<KVReceiver> rx;
  ASSERT_TRUE(WaitFor([&] {
    rx = std::move(KVReceiver::Create(decode, ++room)).value();
    rx->Init(0).IgnoreError();
    // Its lookup (the resolver's) ends in WaitingForInput or Failed.
    WaitFor([&] { return rx->Poll() != KVPoll::kBootstrapping; }, std::chrono::seconds(10));
    return rx->Poll() == KVPoll::kFailed;
  }));
  ASSERT_TRUE(rx->Failure().has_value());
  ASSERT_TRUE(rx->Failure()->origin.SameRank(dead)) << rx->Failure()->Message();
  ASSERT_NO_FATAL_FAILURE(Restart(**c, Role::kPrefill, 1, mo));
  auto tx = std::move(KVSender::Create(*(*c)->prefill[0].manager, room)).value();
  ASSERT_TRUE(WaitFor([&] { return tx->Poll() == KVPoll::kFailed; }, std::chrono::seconds(10)))
      << "prefill tp0 still waits for metadata decode tp0 will never send";
  ASSERT_TRUE(tx->Failure().has_value());
  EXPECT_TRUE(tx->Failure()->origin.SameRank(dead)) << tx->Failure()->Message();
  EXPECT_EQ(tx->Failure()->origin.incarnation, dead.incarnation) << tx->Failure()->Message();
  rx.reset();
  tx.reset();
  TransferAll(**c, ++room);  // the restarted rank serves the next request
}

// KVSender::Create is called on the scheduler's thread too (sglang's
// prefill loop). While a dead sibling's record blocks new requests, whether
// that rank has restarted is the registry's to say; Create leaves the
// question to the registry thread. Against a registry that stopped
// answering, each question waits 2 s for the client's timeout: ten Creates
// took 20 s when Create asked itself. The requests still fail, naming the
// dead sibling (what is known), once the registry thread's read fails.
TEST(RestartTest, CreateWaitsForNoRegistryWhileADeadSiblingBlocks) {
  std::unique_ptr<StallProxy> proxy;
  ClusterOptions o;
  o.prefill_tp = 2;
  o.decode_tp = 1;
  o.bootstrap_via = [&](const std::string& server) {
    if (!proxy) proxy = std::make_unique<StallProxy>(server);
    return proxy->address();
  };
  o.tweak = [](ManagerOptions& m) {
    TolerantLiveness(m);
    // To prefill, the registry counts as lost only after 20 s.
    if (m.role == Role::kPrefill) m.heartbeat_misses = 400;
  };
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(proxy && proxy->ok());
  TransferAll(**c, 1);  // decode meets both prefill ranks
  const RankId dead = (*c)->prefill[1].manager->self();
  (*c)->prefill[1].manager.reset();
  KVManager& sibling = *(*c)->prefill[0].manager;
  uint64_t room = 100;
  // Decode sees the transport go and publishes it; the sibling reads it.
  ASSERT_TRUE(WaitFor([&] { return sibling.RecentRankFailure().has_value(); }));
  auto tx = std::move(KVSender::Create(sibling, ++room)).value();
  ASSERT_TRUE(WaitFor([&] { return tx->Poll() == KVPoll::kFailed; }));
  ASSERT_TRUE(tx->Failure()->origin.SameRank(dead)) << tx->Failure()->Message();
  proxy->Stall();
  std::vector<std::unique_ptr<KVSender>> rooms;
  std::atomic<bool> returned{false};
  std::thread caller([&] {
    for (int i = 0; i < 10; ++i)
      rooms.push_back(std::move(KVSender::Create(sibling, ++room)).value());
    returned = true;
  });
  const bool fast = WaitFor([&] { return returned.load(); }, std::chrono::seconds(5));
  caller.join();
  EXPECT_TRUE(fast) << "ten Creates waited on the registry";
  for (const auto& r : rooms) {
    ASSERT_TRUE(WaitFor([&] { return r->Poll() == KVPoll::kFailed; }, std::chrono::seconds(15)));
    EXPECT_TRUE(r->Failure()->origin.SameRank(dead)) << r->Failure()->Message();
  }
  proxy->Resume();  // the managers deregister through it
}

// GroupFailure() answers on the scheduler's thread (sglang's
// failure_exception) for a rank whose group failed while its own request
// did not. When it holds no record it waits up to three heartbeat
// intervals for one to arrive, reading nothing from the network itself:
// against a registry that stopped answering, a read of its own waited 2 s
// for the client's timeout.
TEST(GroupFailureWaitTest, AskingWhyTheGroupFailedWaitsForNoRegistryThatStoppedAnswering) {
  std::unique_ptr<StallProxy> proxy;
  ClusterOptions o;
  o.bootstrap_via = [&](const std::string& server) {
    if (!proxy) proxy = std::make_unique<StallProxy>(server);
    return proxy->address();
  };
  o.tweak = TolerantLiveness;  // 50 ms intervals: a wait of 150 ms
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(proxy && proxy->ok());
  std::unique_ptr<KVReceiver> rx;
  ASSERT_NO_FATAL_FAILURE(Transfer(**c, 1, KVPoll::kSuccess, &rx));
  proxy->Stall();
  std::optional<FailureRecord> why;
  std::atomic<bool> returned{false};
  std::thread caller([&] {
    why = rx->GroupFailure();
    returned = true;
  });
  const bool fast = WaitFor([&] { return returned.load(); }, std::chrono::milliseconds(1000));
  caller.join();
  EXPECT_TRUE(fast) << "GroupFailure waited on the registry";
  ASSERT_TRUE(why.has_value());
  EXPECT_TRUE(why->is_from_another_rank);
  EXPECT_NE(why->detail.find("no record of why reached"), std::string::npos) << why->Message();
  proxy->Resume();  // the managers deregister through it
}

}  // namespace
}  // namespace kvbridge::internal
