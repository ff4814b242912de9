// sglang's scheduler order on the connector: decode waits for
// WaitingForInput (handshake done) before it allocates pages and calls
// SendMetadata; it frees a failed request's pages as soon as it sees Failed
// and never asks Quiesced() (PollSettled is the poll for that order).
#include <gtest/gtest.h>

#include "connector/connector_test_util.h"
#include "connector/protocol.h"
#include "transport/fault/fault_transport.h"

namespace kvbridge::internal {
namespace {

// Decode's order: receiver, Init, poll until WaitingForInput, only then the
// pages (SendMetadata). Prefill's: sender, poll until WaitingForInput (the
// metadata arrived), then Init and Send.
TEST(SglangOrderTest, ReceiverIsWaitingForInputBeforeMetadataAndTheRequestCompletes) {
  auto c = TestCluster::Create(ClusterOptions{});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Request r{.room = 7, .src = {1, 2, 3, 4}, .dst = {20, 21, 22, 23}};
  r.senders.push_back(std::move(KVSender::Create(*(*c)->prefill[0].manager, r.room)).value());
  (*c)->prefill[0].pool->Fill(r.room, r.src, r.src_aux, r.src_state);
  r.receivers.push_back(std::move(KVReceiver::Create(*(*c)->decode[0].manager, r.room)).value());
  KVReceiver& rx = *r.receivers[0];
  EXPECT_EQ(rx.Poll(), KVPoll::kBootstrapping);
  ASSERT_TRUE(rx.Init(0).ok());
  ASSERT_TRUE(WaitFor([&] { return rx.Poll() == KVPoll::kWaitingForInput; }))
      << "receiver still " << KVPollName(rx.Poll())
      << (rx.Failure() ? ": " + rx.Failure()->Message() : "");
  // No metadata left decode: prefill has nothing to wait for but it.
  EXPECT_EQ(r.senders[0]->Poll(), KVPoll::kBootstrapping);
  ASSERT_TRUE(rx.SendMetadata(r.dst, r.dst_aux, r.dst_state).ok());
  EXPECT_EQ(rx.Poll(), KVPoll::kWaitingForInput);
  ASSERT_TRUE(WaitFor([&] { return r.senders[0]->Poll() == KVPoll::kWaitingForInput; }));
  ASSERT_TRUE(r.senders[0]->Init(r.src.size(), r.src_aux).ok());
  ASSERT_NO_FATAL_FAILURE(SendChunks(r, {3, 1}));
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(**c, r));
}

// sglang's KVTransferMetric: alloc = sender made until decode's metadata
// arrived, transfer = first write posted until the last completed. Each is
// empty until its end is reached; the transfer span lies within the time
// this test measured around Send..Success, the alloc span within the
// sender's whole life up to the metadata.
TEST(SglangOrderTest, TimingSpansTheWaitForMetadataAndTheWrites) {
  auto c = TestCluster::Create(ClusterOptions{});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const auto made = std::chrono::steady_clock::now();
  auto tx = std::move(KVSender::Create(*(*c)->prefill[0].manager, 17)).value();
  EXPECT_FALSE(tx->Timing().alloc_seconds.has_value());
  auto rx = std::move(KVReceiver::Create(*(*c)->decode[0].manager, 17)).value();
  ASSERT_TRUE(rx->Init(0).ok());
  ASSERT_TRUE(WaitFor([&] { return rx->Poll() == KVPoll::kWaitingForInput; }));
  const std::vector<int32_t> src{1, 2, 3}, dst{4, 5, 6};
  (*c)->prefill[0].pool->Fill(17, src, 0, {});
  ASSERT_TRUE(rx->SendMetadata(dst, 0, {}).ok());
  ASSERT_TRUE(WaitFor([&] { return tx->Poll() == KVPoll::kWaitingForInput; }));
  const double until_meta =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - made).count();
  TransferTiming t = tx->Timing();
  ASSERT_TRUE(t.alloc_seconds.has_value());
  EXPECT_GE(*t.alloc_seconds, 0.0);
  EXPECT_LE(*t.alloc_seconds, until_meta);
  EXPECT_FALSE(t.transfer_seconds.has_value()) << "nothing written yet";
  ASSERT_TRUE(tx->Init(3, 0).ok());
  const auto sent = std::chrono::steady_clock::now();
  ASSERT_TRUE(tx->Send(src).ok());
  ASSERT_TRUE(WaitFor([&] { return tx->Poll() == KVPoll::kSuccess; }));
  const double until_done =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
  t = tx->Timing();
  ASSERT_TRUE(t.transfer_seconds.has_value());
  EXPECT_GE(*t.transfer_seconds, 0.0);
  EXPECT_LE(*t.transfer_seconds, until_done);
  EXPECT_EQ(*t.alloc_seconds, *tx->Timing().alloc_seconds) << "fixed once reached";
}

// sglang's prefill reads decode's prefix (pop_decode_prefix_len) once the
// sender is WaitingForInput, before it calls Init.
TEST(SglangOrderTest, SenderTellsTheDecodePrefixOnceMetadataArrived) {
  auto c = TestCluster::Create(ClusterOptions{});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto tx = std::move(KVSender::Create(*(*c)->prefill[0].manager, 13)).value();
  EXPECT_EQ(tx->DecodePrefixPages(), -1);
  auto rx = std::move(KVReceiver::Create(*(*c)->decode[0].manager, 13)).value();
  ASSERT_TRUE(rx->Init(0).ok());
  const std::vector<int32_t> delta{20, 21};
  const int64_t page_size = (*c)->decode[0].manager->options().args.page_size;
  ASSERT_TRUE(rx->SendMetadata(delta, 0, {}, 3 * page_size).ok());
  ASSERT_TRUE(WaitFor([&] { return tx->Poll() == KVPoll::kWaitingForInput; }));
  EXPECT_EQ(tx->DecodePrefixPages(), 3);
  // Init counts the prefix; Send skips it.
  const std::vector<int32_t> src{0, 0, 0, 5, 6};
  (*c)->prefill[0].pool->Fill(13, src, 0, {});
  ASSERT_TRUE(tx->Init(5, 0).ok());
  ASSERT_TRUE(tx->Send(src).ok());
  ASSERT_TRUE(WaitFor([&] { return rx->Poll() == KVPoll::kSuccess; }))
      << KVPollName(rx->Poll()) << (rx->Failure() ? ": " + rx->Failure()->Message() : "");
}

// WaitingForInput means the prefill ranks answered the handshake: while
// their answer is lost the receiver stays Bootstrapping.
TEST(SglangOrderTest, ReceiverStaysBootstrappingUntilTheHandshakeIsAnswered) {
  std::vector<FaultTransport*> faults;
  ClusterOptions o;
  o.wrap = WrapInFaults(&faults);
  o.tweak = TolerantLiveness;
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  FaultTransport& prefill = *faults[0];
  prefill.DropMessages(true);
  const uint64_t dropped_before = prefill.counters().messages_dropped;
  auto rx = std::move(KVReceiver::Create(*(*c)->decode[0].manager, 8)).value();
  ASSERT_TRUE(rx->Init(0).ok());
  // Barrier: prefill answered the Hello (and its answer was dropped).
  ASSERT_TRUE(WaitFor([&] { return prefill.counters().messages_dropped > dropped_before; }));
  EXPECT_EQ(rx->Poll(), KVPoll::kBootstrapping);
  prefill.DropMessages(false);  // decode sends the Hello again; this answer arrives
  ASSERT_TRUE(WaitFor([&] { return rx->Poll() == KVPoll::kWaitingForInput; }))
      << KVPollName(rx->Poll()) << (rx->Failure() ? ": " + rx->Failure()->Message() : "");
}

// A receiver that got no SendMetadata after its handshake fails at the
// waiting deadline, naming it: it does not sit forever.
TEST(SglangOrderTest, NoMetadataAfterTheHandshakeFailsAtTheWaitingDeadline) {
  ClusterOptions o;
  o.tweak = [](ManagerOptions& m) { m.waiting_timeout = std::chrono::milliseconds(300); };
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto rx = std::move(KVReceiver::Create(*(*c)->decode[0].manager, 9)).value();
  ASSERT_TRUE(rx->Init(0).ok());
  ASSERT_TRUE(WaitFor([&] { return rx->Poll() == KVPoll::kWaitingForInput; }));
  ASSERT_TRUE(WaitFor([&] { return rx->Poll() == KVPoll::kFailed; }));
  EXPECT_EQ(rx->Failure()->cause, FailureCause::kDeadlineExceeded);
  EXPECT_NE(rx->Failure()->detail.find("SendMetadata"), std::string::npos)
      << rx->Failure()->Message();
}

// sglang frees the pages right after it saw Failed: PollSettled says Failed
// only once no write of the request can land.
TEST(SglangOrderTest, PollSettledReportsFailedOnlyOnceQuiesced) {
  std::vector<FaultTransport*> faults;
  ClusterOptions o;
  o.wrap = WrapInFaults(&faults);
  o.tweak = TolerantLiveness;
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Request r{.room = 10, .src = {1, 2, 3, 4}, .dst = {30, 31, 32, 33}};
  ASSERT_NO_FATAL_FAILURE(Start(**c, r, /*senders_first=*/false));
  KVReceiver& rx = *r.receivers[0];
  faults[0]->HoldWrites();
  ASSERT_TRUE(r.senders[0]->Send(std::span(r.src).first(2)).ok());
  ASSERT_TRUE(WaitFor([&] { return faults[0]->HeldBatches() > 0; }));
  rx.Abort();
  EXPECT_EQ(rx.Poll(), KVPoll::kFailed);
  EXPECT_FALSE(rx.Quiesced());
  EXPECT_EQ(rx.PollSettled(), KVPoll::kWaitingForInput);  // the state it failed in
  EXPECT_FALSE(rx.WaitQuiesced(std::chrono::milliseconds(50)));
  // Prefill learned of the abort; its write is still held.
  ASSERT_TRUE(WaitFor([&] { return r.senders[0]->Poll() == KVPoll::kFailed; }));
  EXPECT_NE(rx.PollSettled(), KVPoll::kFailed);
  faults[0]->ReleaseHeldWrites();
  EXPECT_TRUE(rx.WaitQuiesced(std::chrono::seconds(30)));
  EXPECT_EQ(rx.PollSettled(), KVPoll::kFailed);
  // Freed on Failed (sglang's order): nothing of the request lands now.
  const std::vector<int32_t> freed = r.dst;
  (*c)->decode[0].pool->Scrub(freed, 0x5a);
  Request next{.room = 11, .src = {5, 6}, .dst = {40, 41}};
  r.senders.clear();
  r.receivers.clear();
  ASSERT_NO_FATAL_FAILURE(Start(**c, next, /*senders_first=*/false));
  ASSERT_NO_FATAL_FAILURE(SendChunks(next, {2}));
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(**c, next));  // a barrier behind any straggler
  EXPECT_TRUE((*c)->decode[0].pool->PagesHold(freed, 0x5a));
}

// A prefill rank that never confirms: PollSettled says Failed after
// quiesce_timeout rather than never.
TEST(SglangOrderTest, PollSettledReportsFailedAfterTheQuiesceTimeout) {
  std::vector<FaultTransport*> faults;
  ClusterOptions o;
  o.wrap = WrapInFaults(&faults);
  o.tweak = [](ManagerOptions& m) {
    TolerantLiveness(m);
    m.quiesce_timeout = std::chrono::milliseconds(200);
  };
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Request r{.room = 12, .src = {1, 2}, .dst = {30, 31}};
  ASSERT_NO_FATAL_FAILURE(Start(**c, r, /*senders_first=*/false));
  faults[0]->HoldWrites();
  ASSERT_TRUE(r.senders[0]->Send(std::span(r.src).first(1)).ok());
  ASSERT_TRUE(WaitFor([&] { return faults[0]->HeldBatches() > 0; }));
  r.receivers[0]->Abort();
  EXPECT_NE(r.receivers[0]->PollSettled(), KVPoll::kFailed);
  ASSERT_TRUE(WaitFor([&] { return r.receivers[0]->PollSettled() == KVPoll::kFailed; }));
  EXPECT_FALSE(r.receivers[0]->Quiesced());
  faults[0]->ReleaseHeldWrites();
}

// sglang saw the group's MIN Failed while this rank's own request is still
// transferring: FailAsGroup fails it with the group's record (never as an
// abort by this rank), and once quiesced its pages may be freed.
TEST(SglangOrderTest, FailAsGroupTakesTheGroupsRecordAndQuiesces) {
  ClusterOptions o;
  o.prefill_tp = 2;
  o.decode_tp = 2;
  o.tweak = TolerantLiveness;
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Request r{.room = 14, .src = Scattered(6, 64, 1), .dst = Scattered(6, 64, 2)};
  ASSERT_NO_FATAL_FAILURE(Start(**c, r, /*senders_first=*/true));
  r.receivers[1]->Abort();
  const FailureRecord want = *r.receivers[1]->Failure();
  FailureRecord got = r.receivers[0]->FailAsGroup();
  EXPECT_EQ(got.origin.tp, 1) << got.Message();
  EXPECT_EQ(got.cause, FailureCause::kAborted);
  ASSERT_TRUE(r.receivers[0]->Failure().has_value());
  EXPECT_EQ(r.receivers[0]->Failure()->origin.tp, 1) << r.receivers[0]->Failure()->Message();
  EXPECT_EQ(r.receivers[0]->Failure()->detail, want.detail);
  EXPECT_TRUE(r.receivers[0]->WaitQuiesced(std::chrono::seconds(30)));
  EXPECT_EQ(r.receivers[0]->PollSettled(), KVPoll::kFailed);
  // Prefill learns decode tp1's record, not an abort by decode tp0.
  for (auto& s : r.senders) {
    ASSERT_TRUE(WaitFor([&] { return s->Poll() == KVPoll::kFailed; }));
    EXPECT_EQ(s->Failure()->origin.tp, 1) << s->Failure()->Message();
  }
}

// A decode rank whose bootstrap address never answered: its requests fail
// saying the registry was never reached, not that it was lost.
TEST(SglangOrderTest, ARegistryNeverReachedIsNotCalledLost) {
  PoolOptions po;
  po.num_pages = 16;
  auto pool = KvPool::Create(po);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  ManagerOptions mo;
  mo.role = Role::kDecode;
  mo.args = (*pool)->Args();
  mo.bootstrap_addr = "127.0.0.1:1";  // nothing listens there
  mo.start_bootstrap_server = false;
  mo.heartbeat_interval = std::chrono::milliseconds(20);
  mo.heartbeat_misses = 3;
  auto transport = CreateLoopbackTransport(std::make_shared<LoopbackFabric>(), "decode tp0");
  ASSERT_TRUE(transport.ok());
  auto m = CreateManager(mo, std::move(transport).value());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto rx = std::move(KVReceiver::Create(**m, 15)).value();
  ASSERT_TRUE(rx->Init(0).ok());
  ASSERT_TRUE(WaitFor([&] { return rx->Poll() == KVPoll::kFailed; }));
  EXPECT_EQ(rx->Failure()->cause, FailureCause::kRegistryLost);
  EXPECT_NE(rx->Failure()->detail.find("never reached"), std::string::npos)
      << rx->Failure()->Message();
}

// A receiver whose first lookup finds prefill not fully registered (sglang's
// server answers 503) stays Bootstrapping, and the resolver's rounds look it
// up again until one succeeds: then it reaches WaitingForInput and the
// request completes. Rounds are run by the test (manual ticks).
TEST(SglangOrderTest, AReceiverWhoseLookupFailedIsLookedUpAgainEachRoundUntilResolved) {
  ClusterOptions o;
  o.sglang_server = true;
  o.hooks.clock = std::make_shared<ManualClock>();
  o.hooks.manual_ticks = true;
  auto made = TestCluster::Create(o);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  TestCluster& c = **made;
  ManagerImpl& decode = ManagerAccess::Of(*c.decode[0].manager);
  c.sglang_server->HoldLookups(true);
  Request r{.room = 9, .src = {1, 2}, .dst = {30, 31}};
  r.receivers.push_back(std::move(KVReceiver::Create(*c.decode[0].manager, r.room)).value());
  KVReceiver& rx = *r.receivers[0];
  ASSERT_TRUE(rx.Init(0).ok());  // Unavailable: retried, not an error
  const int refused = c.sglang_server->held_lookups();
  ASSERT_GE(refused, 1) << "Init made no lookup";
  EXPECT_EQ(rx.Poll(), KVPoll::kBootstrapping);
  decode.TickNow();
  EXPECT_GT(c.sglang_server->held_lookups(), refused) << "a round did not look the room up again";
  EXPECT_EQ(rx.Poll(), KVPoll::kBootstrapping);

  c.sglang_server->HoldLookups(false);
  decode.TickNow();
  ASSERT_TRUE(WaitFor([&] { return rx.Poll() == KVPoll::kWaitingForInput; }))
      << "receiver still " << KVPollName(rx.Poll())
      << (rx.Failure() ? ": " + rx.Failure()->Message() : "");
  r.senders.push_back(std::move(KVSender::Create(*c.prefill[0].manager, r.room)).value());
  c.prefill[0].pool->Fill(r.room, r.src, r.src_aux, r.src_state);
  ASSERT_TRUE(rx.SendMetadata(r.dst, r.dst_aux, r.dst_state).ok());
  ASSERT_TRUE(WaitFor([&] { return r.senders[0]->Poll() == KVPoll::kWaitingForInput; }));
  ASSERT_TRUE(r.senders[0]->Init(r.src.size(), r.src_aux).ok());
  ASSERT_NO_FATAL_FAILURE(SendChunks(r, {2}));
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(c, r));
}

// Review finding (session 35): with sglang's server, which lists only where
// a prefill rank is, the rank's own endpoint serves its record. When the
// server answers and that endpoint does not, the bootstrap deadline named
// the registry (registry_lost, origin bootstrap): the error said
// "unreachable". It names the prefill rank at that position, unreachable.
// The rank is listed at a port where nothing listens; the clock is the
// test's.
TEST(SglangOrderTest, APrefillRankWhoseEndpointDoesNotAnswerIsNamedNotTheRegistry) {
  ClusterOptions o;
  o.sglang_server = true;
  auto clock = std::make_shared<ManualClock>();
  o.hooks.clock = clock;
  o.hooks.manual_ticks = true;
  o.prefill_tp = 2;
  auto made = TestCluster::Create(o);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  TestCluster& c = **made;
  int dead_port = 0;
  {
    auto gone = SglangStandinServer::Start();  // a port that was just closed
    ASSERT_TRUE(gone.ok());
    dead_port = (*gone)->port();
  }
  ASSERT_TRUE(c.sglang_server->MoveRank(0, 0, 1, 0, dead_port));
  auto rx = std::move(KVReceiver::Create(*c.decode[0].manager, 17)).value();
  ASSERT_TRUE(rx->Init(0).ok());  // the lookup fails: retried, not an error
  EXPECT_EQ(rx->Poll(), KVPoll::kBootstrapping);
  clock->Advance(ManagerOptions{}.bootstrap_timeout + std::chrono::seconds(1));
  ManagerAccess::Of(*c.decode[0].manager).TickNow();
  ASSERT_EQ(rx->Poll(), KVPoll::kFailed);
  const FailureRecord got = *rx->Failure();
  EXPECT_EQ(got.cause, FailureCause::kPeerUnreachable) << got.Message();
  EXPECT_EQ(got.origin.role, Role::kPrefill) << got.Message();
  EXPECT_EQ(got.origin.tp, 1) << got.Message();
  EXPECT_EQ(got.origin.host, "127.0.0.1") << got.Message();
  EXPECT_NE(got.detail.find("rank 127.0.0.1:" + std::to_string(dead_port) + " unreachable"),
            std::string::npos)
      << got.Message();
  EXPECT_EQ(got.detail.find("bootstrap server 127.0.0.1:" + std::to_string(dead_port)),
            std::string::npos)
      << got.Message();
}

// A prefill rank decode met but does not read this request from (with
// sglang's server, every rank of the dp is met as a witness) could fail the
// request with a record of its choosing: decode took a RoomFailed with the
// right generation from anyone. Only the request's sources are taken now.
TEST(SglangOrderTest, APrefillRankThatIsNotASourceCannotFailTheRequest) {
  ClusterOptions o;
  o.sglang_server = true;
  o.prefill_tp = 2;
  o.decode_tp = 2;
  o.tweak = TolerantLiveness;
  auto made = TestCluster::Create(o);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  TestCluster& c = **made;
  Request r{.room = 5, .src = {1, 2}, .dst = {3, 4}};
  ASSERT_NO_FATAL_FAILURE(Start(c, r, false));
  KVManager& decode = *c.decode[0].manager;
  KVManager& other = *c.prefill[1].manager;  // decode tp0 reads from prefill tp0 only
  FailureRecord forged;
  forged.room = r.room;
  forged.origin = other.self();
  forged.cause = FailureCause::kAborted;
  forged.detail = "not this rank's to say";
  ASSERT_TRUE(WaitFor([&] {  // the witness's handshake may still be under way
    auto p = PeerAt(ManagerAccess::Of(other), decode.self());
    return p && p->ready;
  }));
  const uint64_t before = decode.Stats().invalid_messages_dropped;
  ASSERT_TRUE(ManagerAccess::Of(other)
                  .transport()
                  .SendMessage(ProvenEndpoint(other, decode.self()),
                               EncodeMessage(other.self(),
                                             RoomFailedMsg{r.room, r.receivers[0]->generation(),
                                                           false, forged}))
                  .ok());
  ASSERT_TRUE(WaitFor([&] { return decode.Stats().invalid_messages_dropped == before + 1; }));
  EXPECT_NE(r.receivers[0]->Poll(), KVPoll::kFailed) << r.receivers[0]->Failure()->Message();
  ASSERT_NO_FATAL_FAILURE(SendChunks(r, {2}));
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(c, r));
}

}  // namespace
}  // namespace kvbridge::internal
