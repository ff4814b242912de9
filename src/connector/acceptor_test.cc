// A proven Hello is accepted on the acceptor thread (ManagerImpl::
// AcceptRound), not on the transport thread that delivered its proof.
// Accepting maps the peer's regions: a same-host mapping fills its page
// tables (~0.07 s/GiB), 0.3 s for `kvbridge bench requests --prefill-tp 2
// --decode-tp 1`'s pools, and on the transport thread that held every other
// message to the rank, so that its peers heard nothing from it.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "connector/connector_test_util.h"
#include "connector/registry_test_util.h"
#include "transport/forwarding_transport.h"

namespace kvbridge::internal {
namespace {

// A transport that keeps the manager's failure handler, so that a test can
// report an endpoint failed as the transport would on a connection reset,
// and records the endpoints the manager closes.
class WatchedEndpoints : public ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  void SetPeerFailureHandler(PeerFailureHandler h) override {
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      on_failure_ = h;
    }
    ForwardingTransport::SetPeerFailureHandler(std::move(h));
  }
  void Disconnect(PeerId peer) override {
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      disconnected_.push_back(peer);
      watch_cv_.notify_all();
    }
    ForwardingTransport::Disconnect(peer);
  }
  void Fail(PeerId peer, const Status& why) {
    PeerFailureHandler h;
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      h = on_failure_;
    }
    ASSERT_TRUE(h && peer != 0);
    h(peer, why);
  }
  // Whether the manager closes `peer` within `timeout`.
  bool WaitForDisconnected(PeerId peer, std::chrono::seconds timeout) {
    std::unique_lock<std::mutex> lock(watch_mu_);
    return watch_cv_.wait_for(lock, timeout, [&] {
      return peer != 0 &&
             std::find(disconnected_.begin(), disconnected_.end(), peer) != disconnected_.end();
    });
  }

 private:
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  std::vector<PeerId> disconnected_;
  PeerFailureHandler on_failure_;
};

// Prefill's transport, whose ImportRegion waits while held.
class HeldImports : public WatchedEndpoints {
 public:
  using WatchedEndpoints::WatchedEndpoints;
  Result<RemoteRegionId> ImportRegion(PeerId peer, std::string_view key) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (hold_) {
        held_peer_ = peer;
        ++waiting_;
        cv_.notify_all();
        cv_.wait(lock, [&] { return !hold_; });
      }
    }
    return WatchedEndpoints::ImportRegion(peer, key);
  }
  // The endpoint an import was held for (0: none yet).
  PeerId held_peer() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_peer_;
  }
  void Hold() {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = true;
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = false;
    cv_.notify_all();
  }
  // Whether an import waits, within `timeout`.
  bool WaitForHeldImport(std::chrono::seconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return waiting_ > 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool hold_ = false;
  int waiting_ = 0;
  PeerId held_peer_ = 0;
};

// `t` wrapped in a W, which `*out` then points to.
template <typename W>
std::unique_ptr<Transport> Wrapped(std::unique_ptr<Transport> t, W** out) {
  auto w = std::make_unique<W>(std::move(t));
  *out = w.get();
  return w;
}

// Prefill tp1 -> decode tp2, prefill's transport in HeldImports (`*held`).
Result<std::unique_ptr<TestCluster>> HeldCluster(HeldImports** held) {
  ClusterOptions o;
  o.decode_tp = 2;
  o.wrap = [held](std::unique_ptr<Transport> t, Role role, int) -> std::unique_ptr<Transport> {
    return role == Role::kPrefill ? Wrapped(std::move(t), held) : std::move(t);
  };
  return TestCluster::Create(o);
}

// Decode tp0 meets prefill; then decode tp1's Hello is accepted while
// prefill's region imports are held. Decode tp0's heartbeats, which arrive
// meanwhile, are still heard: no message waits behind an acceptance.
TEST(AcceptorTest, AHelloBeingAcceptedHoldsNoMessageFromAnotherPeer) {
  HeldImports* held = nullptr;
  auto c = HeldCluster(&held);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_NE(held, nullptr);
  KVManager& prefill = *(*c)->prefill[0].manager;
  KVManager& d0 = *(*c)->decode[0].manager;
  KVManager& d1 = *(*c)->decode[1].manager;
  auto rx0 = std::move(KVReceiver::Create(d0, 1)).value();
  ASSERT_TRUE(rx0->Init(0).ok());
  ASSERT_TRUE(WaitFor([&] { return rx0->Poll() == KVPoll::kWaitingForInput; }))
      << KVPollName(rx0->Poll());

  held->Hold();
  auto rx1 = std::move(KVReceiver::Create(d1, 1)).value();
  ASSERT_TRUE(rx1->Init(0).ok());  // its Hello's acceptance waits in ImportRegion
  ASSERT_TRUE(held->WaitForHeldImport(std::chrono::seconds(10))) << "decode tp1 sent no Hello";
  auto heard = [&] { return PeerAt(ManagerAccess::Of(prefill), d0.self())->last_heard; };
  const SteadyTime before = heard();
  const bool heard_again = WaitFor([&] { return heard() > before; }, std::chrono::seconds(5));
  held->Release();
  EXPECT_TRUE(heard_again) << "prefill heard nothing from decode tp0 while accepting decode tp1";
  // Released, the acceptance completes: decode tp1 is a proven peer.
  EXPECT_TRUE(WaitFor([&] {
    auto p = PeerAt(ManagerAccess::Of(prefill), d1.self());
    return p.has_value() && p->ready && !p->failed;
  })) << "decode tp1 was never accepted";
}

// Prefill rejoins (a record declared this incarnation failed) while decode
// tp1's Hello is being accepted: the proof named the old incarnation, so the
// acceptance is dropped (its endpoint closed, no answer) instead of
// installing a ready peer on a session the rejoin has ended.
TEST(AcceptorTest, AnAcceptanceOutlivedByARejoinIsDropped) {
  HeldImports* held = nullptr;
  auto c = HeldCluster(&held);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  KVManager& prefill = *(*c)->prefill[0].manager;
  KVManager& d0 = *(*c)->decode[0].manager;
  KVManager& d1 = *(*c)->decode[1].manager;
  const uint64_t before = prefill.self().incarnation;
  held->Hold();
  auto rx1 = std::move(KVReceiver::Create(d1, 1)).value();
  ASSERT_TRUE(rx1->Init(0).ok());
  ASSERT_TRUE(held->WaitForHeldImport(std::chrono::seconds(10))) << "decode tp1 sent no Hello";
  ASSERT_NO_FATAL_FAILURE(
      PublishDeath((*c)->bootstrap_address(), d0.self(), DeathOf(prefill.self())));
  ASSERT_TRUE(WaitFor([&] { return prefill.self().incarnation != before; }))
      << "prefill never rejoined";
  held->Release();
  // Barrier: the acceptance ended by closing the endpoint it was for.
  EXPECT_TRUE(held->WaitForDisconnected(held->held_peer(), std::chrono::seconds(10)))
      << "the outdated acceptance kept its endpoint";
}

// The transport reports the endpoint of decode tp1's Hello failed while
// the Hello is being accepted (regions being mapped), before any peer holds
// that endpoint. The acceptance is dropped (the endpoint closed, no answer),
// and decode tp1's Hello sent again is accepted on a new endpoint. Before,
// the report found no peer and was lost: decode tp1 was installed, ready,
// on the endpoint its transport had called failed.
TEST(AcceptorTest, AnEndpointThatFailsWhileItsHelloIsAcceptedIsDropped) {
  HeldImports* held = nullptr;
  auto c = HeldCluster(&held);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  KVManager& prefill = *(*c)->prefill[0].manager;
  KVManager& d1 = *(*c)->decode[1].manager;
  held->Hold();
  auto rx1 = std::move(KVReceiver::Create(d1, 1)).value();
  ASSERT_TRUE(rx1->Init(0).ok());
  ASSERT_TRUE(held->WaitForHeldImport(std::chrono::seconds(10))) << "decode tp1 sent no Hello";
  const PeerId failed = held->held_peer();
  ASSERT_NO_FATAL_FAILURE(held->Fail(failed, Status(StatusCode::kUnavailable, "connection reset")));
  held->Release();
  // Barrier: the acceptance ended by closing the endpoint it was for.
  EXPECT_TRUE(held->WaitForDisconnected(held->held_peer(), std::chrono::seconds(10)))
      << "decode tp1 was accepted on an endpoint its transport reported failed";
  ASSERT_TRUE(
      WaitFor([&] { return rx1->Poll() == KVPoll::kWaitingForInput; }, std::chrono::seconds(20)))
      << KVPollName(rx1->Poll()) << " " << rx1->Failure().value_or(FailureRecord{}).Message();
  std::optional<PeerSnapshot> p = PeerAt(ManagerAccess::Of(prefill), d1.self());
  ASSERT_TRUE(p.has_value());
  EXPECT_TRUE(p->ready && !p->failed);
  EXPECT_NE(p->endpoint, failed) << "decode tp1's peer holds the endpoint reported failed";
}

// Decode's transport: the second message it sends on its first endpoint
// (after the Hello: its proof) is kept back until released.
class HeldProofs : public ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  Status SendMessage(PeerId peer, std::string payload) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (++sent_[peer] == 2 && !kept_) {
        kept_ = true;
        held_.emplace_back(peer, std::move(payload));
        cv_.notify_all();
        return Status();
      }
    }
    return ForwardingTransport::SendMessage(peer, std::move(payload));
  }
  bool WaitForHeldProof(std::chrono::seconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return !held_.empty(); });
  }
  // Whether every kept message was sent: best effort, as the kept
  // message's own send was (decode may have let that endpoint go meanwhile).
  bool Release() {
    std::vector<std::pair<PeerId, std::string>> held;
    {
      std::lock_guard<std::mutex> lock(mu_);
      held.swap(held_);
    }
    bool sent = true;
    for (auto& [peer, payload] : held)
      sent = ForwardingTransport::SendMessage(peer, std::move(payload)).ok() && sent;
    return sent;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<PeerId, int> sent_;
  bool kept_ = false;
  std::vector<std::pair<PeerId, std::string>> held_;
};

// Prefill's transport: also the endpoints it connects (back to a decode
// rank that said Hello).
class WatchedConnects : public WatchedEndpoints {
 public:
  using WatchedEndpoints::WatchedEndpoints;
  Result<PeerId> Connect(std::string_view address) override {
    Result<PeerId> p = WatchedEndpoints::Connect(address);
    std::lock_guard<std::mutex> lock(mu_);
    if (p.ok()) connected_.push_back(*p);
    return p;
  }
  std::vector<PeerId> connected() {
    std::lock_guard<std::mutex> lock(mu_);
    return connected_;
  }

 private:
  std::mutex mu_;
  std::vector<PeerId> connected_;
};

// The transport reports the endpoint of decode's Hello failed after prefill
// challenged it and before decode's proof arrives. Prefill lets that
// endpoint go; the proof, released afterwards, is taken on a new endpoint
// (prefill keeps no Hello: the proof brings it, peer_auth.h), or decode's
// Hello sent again is. Before, the report found no peer and was lost, and
// the proof made decode a ready peer on the endpoint its transport had
// called failed.
TEST(AcceptorTest, AnEndpointThatFailsBeforeItsHelloIsProvenIsLetGo) {
  HeldProofs* proofs = nullptr;
  WatchedConnects* connects = nullptr;
  ClusterOptions o;
  o.wrap = [&](std::unique_ptr<Transport> t, Role role, int) -> std::unique_ptr<Transport> {
    if (role == Role::kDecode) return Wrapped(std::move(t), &proofs);
    return Wrapped(std::move(t), &connects);
  };
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(proofs != nullptr && connects != nullptr);
  KVManager& prefill = *(*c)->prefill[0].manager;
  KVManager& d = *(*c)->decode[0].manager;
  auto rx = std::move(KVReceiver::Create(d, 1)).value();
  ASSERT_TRUE(rx->Init(0).ok());
  ASSERT_TRUE(proofs->WaitForHeldProof(std::chrono::seconds(10))) << "decode sent no proof";
  const std::vector<PeerId> back = connects->connected();
  ASSERT_EQ(back.size(), 1u) << "prefill should have connected back once, to challenge";
  ASSERT_NO_FATAL_FAILURE(connects->Fail(back[0], Status(StatusCode::kUnavailable, "reset")));
  // Barrier: the failure was taken (the endpoint closed) before the proof goes.
  EXPECT_TRUE(connects->WaitForDisconnected(back[0], std::chrono::seconds(10)))
      << "prefill kept the endpoint its transport reported failed";
  // Under load decode may have sent its Hello again and let the first
  // endpoint go: then no proof leaves, and the checks below stand alone.
  proofs->Release();
  ASSERT_TRUE(
      WaitFor([&] { return rx->Poll() == KVPoll::kWaitingForInput; }, std::chrono::seconds(20)))
      << KVPollName(rx->Poll()) << " " << rx->Failure().value_or(FailureRecord{}).Message();
  std::optional<PeerSnapshot> p = PeerAt(ManagerAccess::Of(prefill), d.self());
  ASSERT_TRUE(p.has_value());
  EXPECT_TRUE(p->ready && !p->failed);
  EXPECT_NE(p->endpoint, back[0]) << "decode's peer holds the endpoint reported failed";
}

// The record of `declared`'s death, as prefill would have detected it.
FailureRecord DeathDetectedBy(const RankId& declared, const RankId& prefill) {
  FailureRecord death = DeathOf(declared);
  death.detected_by = prefill;
  return death;
}

// Decode tp1, declared failed as `declared`, fenced itself: `rx` failed with
// that record. Then it rejoins and a whole request goes through.
void ExpectFencedThenServing(TestCluster& c, KVReceiver& rx, const RankId& declared,
                             bool sglang_server) {
  KVManager& d1 = *c.decode[1].manager;
  ASSERT_TRUE(WaitFor([&] { return rx.Poll() == KVPoll::kFailed; })) << KVPollName(rx.Poll());
  std::optional<FailureRecord> why = rx.Failure();
  ASSERT_TRUE(why.has_value());
  EXPECT_TRUE(why->origin.SameRank(declared) && why->origin.incarnation == declared.incarnation)
      << why->Message();
  EXPECT_EQ(why->cause, FailureCause::kPeerExited) << why->Message();
  ASSERT_TRUE(WaitFor([&] { return d1.Stats().rejoins == 1; })) << "decode tp1 never rejoined";
  EXPECT_NE(d1.self().incarnation, declared.incarnation);
  // With sglang's server its next round meets prefill again as the new
  // incarnation, and only that lifts prefill's record of the old one (with
  // kvbridge's registry prefill asks the registry when a request comes).
  ASSERT_TRUE(!sglang_server || WaitFor([&] {
    auto p = PeerAt(ManagerAccess::Of(*c.prefill[0].manager), d1.self());
    return p && p->ready && !p->failed && p->id.incarnation == d1.self().incarnation;
  })) << "prefill never met decode tp1's new incarnation";
  Request r{.room = 2};
  r.src = {1, 2, 3};
  r.dst = {7, 8, 9};
  Start(c, r, false);
  SendChunks(r, {2, 1});
  ExpectDelivered(c, r);
}

// A decode process that a record declared failed, alive and not yet told,
// says Hello to a prefill rank that holds the record (here it reached
// prefill alone) and no peer there. Prefill refuses it, as often as it
// tries, and never makes it a peer; decode takes the refusal for no failure
// of prefill's. Once the registry tells it, it fences itself (its request
// fails naming that process) and comes back as a new incarnation, which
// prefill accepts. Before, prefill made the declared-failed process a peer.
TEST(AcceptorTest, AHelloFromAProcessDeclaredFailedIsRefusedUntilItRejoins) {
  ClusterOptions o;
  o.decode_tp = 2;
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  KVManager& prefill = *(*c)->prefill[0].manager;
  KVManager& d1 = *(*c)->decode[1].manager;
  const RankId declared = d1.self();
  const uint64_t prefill_incarnation = prefill.self().incarnation;
  const FailureRecord death = DeathDetectedBy(declared, prefill.self());
  ManagerAccess::Of(prefill).ApplyRecordForTest(death, false);
  auto rx = std::move(KVReceiver::Create(d1, 1)).value();
  ASSERT_TRUE(rx->Init(0).ok());  // its Hello
  // Barrier: refused twice (its first Hello and one sent again).
  ASSERT_TRUE(WaitFor([&] { return d1.Stats().handshakes_refused_as_declared_failed >= 2; },
                      std::chrono::seconds(20)))
      << "decode heard " << d1.Stats().handshakes_refused_as_declared_failed << " refusals";
  std::optional<PeerSnapshot> held = PeerAt(ManagerAccess::Of(prefill), declared);
  EXPECT_FALSE(held.has_value() && held->id.incarnation == declared.incarnation && held->ready)
      << "prefill made the declared-failed process a peer";
  EXPECT_EQ(rx->Poll(), KVPoll::kBootstrapping)
      << rx->Failure().value_or(FailureRecord{}).Message();
  std::optional<FailureRecord> blamed = d1.RecentRankFailure();
  EXPECT_FALSE(blamed.has_value()) << "decode blamed a refusal on " << blamed->Message();
  EXPECT_EQ(prefill.self().incarnation, prefill_incarnation);
  // The registry tells it (prefill publishes the record).
  ManagerAccess::Of(prefill).ApplyRecordForTest(death, true);
  ExpectFencedThenServing(**c, *rx, declared, false);
}

// Decode's transport: after its proof (the second message on the first
// endpoint it sends on) it sends nothing more, so it cannot say Hello again.
class SilentAfterProof : public ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  Status SendMessage(PeerId peer, std::string payload) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (first_ == 0) first_ = peer;
      if (proof_sent_) return Status();
      proof_sent_ = peer == first_ && ++sent_ == 2;
    }
    return ForwardingTransport::SendMessage(peer, std::move(payload));
  }
  bool proof_sent() {
    std::lock_guard<std::mutex> lock(mu_);
    return proof_sent_;
  }

 private:
  std::mutex mu_;
  PeerId first_ = 0;
  int sent_ = 0;
  bool proof_sent_ = false;
};

// A record declares decode tp1's process failed after its proof, while
// prefill maps its regions. Prefill answers that very session with the
// refusal, as it answers a Hello proven after the record, and makes it no
// peer. Decode says nothing after its proof here, so the refusal it hears
// can only be that answer. Before, the acceptance was dropped unanswered,
// and decode learnt only from a Hello sent again.
TEST(AcceptorTest, AProcessDeclaredFailedWhileItsHelloIsAcceptedIsAnswered) {
  HeldImports* held = nullptr;
  SilentAfterProof* silent = nullptr;
  ClusterOptions o;
  o.decode_tp = 2;
  o.wrap = [&](std::unique_ptr<Transport> t, Role role, int rank) -> std::unique_ptr<Transport> {
    if (role == Role::kPrefill) return Wrapped(std::move(t), &held);
    return rank == 1 ? Wrapped(std::move(t), &silent) : std::move(t);
  };
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(held != nullptr && silent != nullptr);
  KVManager& prefill = *(*c)->prefill[0].manager;
  KVManager& d1 = *(*c)->decode[1].manager;
  const RankId declared = d1.self();
  held->Hold();
  auto rx1 = std::move(KVReceiver::Create(d1, 1)).value();
  ASSERT_TRUE(rx1->Init(0).ok());
  ASSERT_TRUE(held->WaitForHeldImport(std::chrono::seconds(10))) << "decode tp1 sent no Hello";
  ASSERT_TRUE(silent->proof_sent());
  ManagerAccess::Of(prefill).ApplyRecordForTest(DeathDetectedBy(declared, prefill.self()), false);
  held->Release();
  ASSERT_TRUE(WaitFor([&] { return d1.Stats().handshakes_refused_as_declared_failed >= 1; },
                      std::chrono::seconds(10)))
      << "the acceptance of a process declared failed since its proof went unanswered";
  EXPECT_TRUE(held->WaitForDisconnected(held->held_peer(), std::chrono::seconds(10)))
      << "prefill kept the refused session's endpoint";
  std::optional<PeerSnapshot> p = PeerAt(ManagerAccess::Of(prefill), declared);
  EXPECT_FALSE(p.has_value() && p->id.incarnation == declared.incarnation && p->ready)
      << "prefill made the declared-failed process a peer";
  std::optional<FailureRecord> blamed = d1.RecentRankFailure();
  EXPECT_FALSE(blamed.has_value()) << "decode blamed the refusal on " << blamed->Message();
}

// Prefill tp1 -> decode tp2 (`o` otherwise): prefill applies, unpublished,
// a record declaring decode tp1's process failed; then decode tp1 says
// Hello for a request (room 1).
struct DeclaredHello {
  std::unique_ptr<TestCluster> cluster;
  RankId declared;
  std::unique_ptr<KVReceiver> rx;
};
void SayHelloDeclaredFailed(ClusterOptions o, DeclaredHello* h) {
  o.decode_tp = 2;
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  h->cluster = std::move(*c);
  KVManager& prefill = *h->cluster->prefill[0].manager;
  KVManager& d1 = *h->cluster->decode[1].manager;
  h->declared = d1.self();
  ManagerAccess::Of(prefill).ApplyRecordForTest(DeathDetectedBy(h->declared, prefill.self()),
                                                false);
  h->rx = std::move(KVReceiver::Create(d1, 1)).value();
  ASSERT_TRUE(h->rx->Init(0).ok());  // its Hello
}

// The registry never confirms the record prefill holds (here it holds it
// alone): decode's request, waiting for its handshake as sglang's decode
// waits for WaitingForInput before SendMetadata, fails at its deadline
// naming this process and the refusal. Before, it said "the application
// did not call SendMetadata", which sent the operator to sglang.
TEST(AcceptorTest, ARequestRefusedUntilItsDeadlineNamesTheRefusal) {
  ClusterOptions o;
  o.tweak = [](ManagerOptions& m) { m.waiting_timeout = std::chrono::milliseconds(1500); };
  DeclaredHello h;
  ASSERT_NO_FATAL_FAILURE(SayHelloDeclaredFailed(o, &h));
  const RankId& declared = h.declared;
  KVReceiver& rx = *h.rx;
  ASSERT_TRUE(WaitFor([&] { return rx.Poll() == KVPoll::kFailed; }, std::chrono::seconds(20)))
      << KVPollName(rx.Poll());
  const FailureRecord r = rx.Failure().value_or(FailureRecord{});
  EXPECT_EQ(r.origin.role, Role::kDecode);
  EXPECT_EQ(r.origin.tp, 1);
  EXPECT_EQ(r.origin.incarnation, declared.incarnation);
  EXPECT_NE(r.detail.find("prefill tp0 refused this process's handshake"), std::string::npos)
      << r.Message();
  EXPECT_NE(r.detail.find("a failure record declared this process failed"), std::string::npos)
      << r.Message();
  EXPECT_EQ(r.phase, Phase::kBootstrapping) << r.Message();
}

// With sglang's server no registry keeps records: prefill, which detected
// the failure, tells the process itself with the refusal.
TEST(AcceptorTest, WithSglangsServerTheRefusedProcessIsToldByTheDetector) {
  ClusterOptions o;
  o.sglang_server = true;
  DeclaredHello h;
  ASSERT_NO_FATAL_FAILURE(SayHelloDeclaredFailed(o, &h));
  ExpectFencedThenServing(*h.cluster, *h.rx, h.declared, true);
}

}  // namespace
}  // namespace kvbridge::internal
