// Failure detection, attribution and propagation over the loopback
// transport (the process-level fault matrix is in tests/integration).
#include <gtest/gtest.h>

#include "connector/test_cluster.h"
#include "transport/fault/fault_transport.h"

namespace kvbridge::internal {
namespace {

struct Room {
  std::vector<std::unique_ptr<KVSender>> senders;
  std::vector<std::unique_ptr<KVReceiver>> receivers;
  std::vector<int32_t> src{1, 2, 3, 4}, dst{10, 11, 12, 13};
};

// Brings `room` to WaitingForInput on every rank (sender Init done).
void Open(TestCluster& c, uint64_t id, Room& r) {
  for (auto& d : c.decode) {
    r.receivers.push_back(std::move(KVReceiver::Create(*d.manager, id)).value());
    ASSERT_TRUE(r.receivers.back()->Init(0).ok());
    ASSERT_TRUE(r.receivers.back()->SendMetadata(r.dst, 0, {}).ok());
  }
  for (auto& p : c.prefill) {
    r.senders.push_back(std::move(KVSender::Create(*p.manager, id)).value());
    p.pool->Fill(id, r.src, 0, {});
  }
  ASSERT_TRUE(WaitFor([&] {
    for (auto& s : r.senders)
      if (s->Poll() != KVPoll::kWaitingForInput) return false;
    return true;
  }));
  for (auto& s : r.senders) ASSERT_TRUE(s->Init(r.src.size(), 0).ok());
}

// Every record names `origin` and a cause from `causes`; the flag is set
// exactly when the holder is not the origin.
void ExpectAttributed(const std::optional<FailureRecord>& f, const RankId& origin,
                      std::initializer_list<FailureCause> causes, bool holder_is_origin = false) {
  ASSERT_TRUE(f.has_value());
  EXPECT_TRUE(f->origin.SameRank(origin)) << f->Message();
  EXPECT_EQ(f->origin.pid, origin.pid);
  bool cause_ok = false;
  for (FailureCause c : causes) cause_ok = cause_ok || f->cause == c;
  EXPECT_TRUE(cause_ok) << f->Message();
  EXPECT_EQ(f->is_from_another_rank, !holder_is_origin) << f->Message();
  EXPECT_FALSE(f->mechanism.empty());
  EXPECT_NE(f->Message().find(origin.ShortName()), std::string::npos) << f->Message();
}

ClusterOptions TwoByTwo() {
  ClusterOptions o;
  o.prefill_tp = 2;
  o.decode_tp = 2;
  o.tweak = TolerantLiveness;
  return o;
}

// Wraps every transport of the cluster in a FaultTransport, collected in
// creation order (prefill ranks first).
std::function<std::unique_ptr<Transport>(std::unique_ptr<Transport>, Role, int)> WrapInFaults(
    std::vector<FaultTransport*>* faults) {
  return [faults](std::unique_ptr<Transport> t, Role, int) -> std::unique_ptr<Transport> {
    auto f = std::make_unique<FaultTransport>(std::move(t));
    faults->push_back(f.get());
    return f;
  };
}

TEST(FailurePropagationTest, ReportFatalReachesEverySiblingAndPeer) {
  auto c = TestCluster::Create(TwoByTwo());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Room r;
  Open(**c, 5, r);
  KVManager& victim = *(*c)->prefill[1].manager;
  const RankId origin = victim.self();
  victim.ReportFatal("CUDA out of memory: tried to allocate 2.00 GiB");
  for (size_t i = 0; i < r.senders.size(); ++i) {
    ASSERT_TRUE(WaitFor([&] { return r.senders[i]->Poll() == KVPoll::kFailed; }))
        << "prefill " << i;
    ExpectAttributed(r.senders[i]->Failure(), origin, {FailureCause::kLocalError}, i == 1);
    EXPECT_NE(r.senders[i]->Failure()->detail.find("CUDA out of memory"), std::string::npos);
  }
  for (size_t i = 0; i < r.receivers.size(); ++i) {
    ASSERT_TRUE(WaitFor([&] { return r.receivers[i]->Poll() == KVPoll::kFailed; }))
        << "decode " << i;
    ExpectAttributed(r.receivers[i]->Failure(), origin, {FailureCause::kLocalError});
    EXPECT_NE(r.receivers[i]->Failure()->Message().find("CUDA out of memory"), std::string::npos);
    EXPECT_TRUE(WaitFor([&] { return r.receivers[i]->Quiesced(); }));
  }
  // New requests on the failed rank and its sibling fail at once, named.
  auto late = std::move(KVSender::Create(*(*c)->prefill[0].manager, 6)).value();
  ASSERT_TRUE(WaitFor([&] { return late->Poll() == KVPoll::kFailed; }));
  ExpectAttributed(late->Failure(), origin, {FailureCause::kLocalError});
  // Decode learns of the rank (not just of its requests) from the RankFailed
  // message or the registry, whichever comes first.
  EXPECT_TRUE(WaitFor([&] { return (*c)->decode[0].manager->RecentRankFailure().has_value(); }));
}

TEST(FailurePropagationTest, VanishedPrefillRankIsNamedByEverySurvivor) {
  std::vector<FaultTransport*> faults;
  ClusterOptions o = TwoByTwo();
  o.wrap = WrapInFaults(&faults);
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Room r;
  Open(**c, 7, r);
  const RankId origin = (*c)->prefill[0].manager->self();
  // decode tp0 loses prefill tp0 (its only source); the others never talk
  // to it and must learn through the registry.
  faults[2]->VanishPeer(1);  // decode tp0's one connection: prefill tp0
  ASSERT_TRUE(WaitFor([&] { return r.receivers[0]->Poll() == KVPoll::kFailed; }));
  ExpectAttributed(r.receivers[0]->Failure(), origin,
                   {FailureCause::kPeerUnreachable, FailureCause::kPeerExited});
  EXPECT_EQ(r.receivers[0]->Failure()->mechanism, "transport error");
  ASSERT_TRUE(WaitFor([&] { return r.senders[1]->Poll() == KVPoll::kFailed; }));
  ExpectAttributed(r.senders[1]->Failure(), origin,
                   {FailureCause::kPeerUnreachable, FailureCause::kPeerExited});
  ASSERT_TRUE(WaitFor([&] { return r.receivers[1]->Poll() == KVPoll::kFailed; }));
  ExpectAttributed(r.receivers[1]->Failure(), origin,
                   {FailureCause::kPeerUnreachable, FailureCause::kPeerExited});
  EXPECT_EQ(r.receivers[1]->Failure()->detected_by.ShortName(), "decode tp0");
}

TEST(FailurePropagationTest, StalledTransferHitsTheTransferDeadlineNamingPeerAndPhase) {
  std::vector<FaultTransport*> faults;
  ClusterOptions o;
  o.tweak = [](ManagerOptions& m) { m.transfer_timeout = std::chrono::milliseconds(300); };
  o.wrap = WrapInFaults(&faults);
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Room r;
  Open(**c, 9, r);
  (*c)->decode[0].pool->Scrub(r.dst, 0xEE);
  faults[0]->HoldWrites();
  ASSERT_TRUE(r.senders[0]->Send(r.src).ok());
  ASSERT_TRUE(WaitFor([&] { return r.senders[0]->Poll() == KVPoll::kFailed; }));
  auto f = r.senders[0]->Failure();
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->cause, FailureCause::kDeadlineExceeded);
  EXPECT_EQ(f->phase, Phase::kTransferring);
  EXPECT_EQ(f->origin.ShortName(), "decode tp0");
  ASSERT_TRUE(WaitFor([&] { return r.receivers[0]->Poll() == KVPoll::kFailed; }));
  EXPECT_EQ(r.receivers[0]->Failure()->cause, FailureCause::kDeadlineExceeded);
  // The writes are still held: decode must not reuse the pages yet.
  EXPECT_FALSE(r.receivers[0]->Quiesced());
  faults[0]->ReleaseHeldWrites();
  ASSERT_TRUE(WaitFor([&] { return r.receivers[0]->Quiesced(); }));
  // After the signal the late bytes have landed; scrub and check nothing moves.
  (*c)->decode[0].pool->Scrub(r.dst, 0x11);
  EXPECT_TRUE((*c)->decode[0].pool->PagesHold(r.dst, 0x11));
}

TEST(AbortTest, DecodeAbortWaitsForInFlightWritesBeforeQuiescing) {
  std::vector<FaultTransport*> faults;
  ClusterOptions o;
  o.wrap = WrapInFaults(&faults);
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Room r;
  Open(**c, 3, r);
  faults[0]->HoldWrites();
  ASSERT_TRUE(r.senders[0]->Send(std::span(r.src).first(2)).ok());
  ASSERT_TRUE(WaitFor([&] { return faults[0]->HeldBatches() > 0; }));
  r.receivers[0]->Abort();
  EXPECT_EQ(r.receivers[0]->Poll(), KVPoll::kFailed);
  EXPECT_EQ(r.receivers[0]->Failure()->cause, FailureCause::kAborted);
  EXPECT_FALSE(r.receivers[0]->Failure()->is_from_another_rank);
  // Prefill learns of the abort, but a write is still in flight.
  ASSERT_TRUE(WaitFor([&] { return r.senders[0]->Poll() == KVPoll::kFailed; }));
  EXPECT_EQ(r.senders[0]->Failure()->origin.ShortName(), "decode tp0");
  EXPECT_FALSE(r.receivers[0]->Quiesced());
  faults[0]->ReleaseHeldWrites();
  ASSERT_TRUE(WaitFor([&] { return r.receivers[0]->Quiesced(); }));
  // Quiesced: scrub the pages; no byte of the aborted request may land now.
  (*c)->decode[0].pool->Scrub(r.dst, 0x33);
  EXPECT_EQ(r.senders[0]->Send(std::span(r.src).subspan(2)).code(), StatusCode::kAborted);
  // Drive another request through the same pair to flush any stragglers.
  Room next;
  next.src = {20, 21};
  next.dst = {30, 31};
  Open(**c, 4, next);
  ASSERT_TRUE(next.senders[0]->Send(next.src).ok());
  ASSERT_TRUE(WaitFor([&] { return next.receivers[0]->Poll() == KVPoll::kSuccess; }));
  EXPECT_TRUE((*c)->decode[0].pool->PagesHold(r.dst, 0x33));
}

}  // namespace
}  // namespace kvbridge::internal
