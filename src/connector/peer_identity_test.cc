// Peers prove who they are (issue 12, finding 6). Each test is an attack
// that worked before the authenticated handshake: a process that can reach a
// rank's endpoint (worker addresses are public in the registry) sends
// control messages claiming to be another rank. Now they are dropped and
// counted (unauthenticated_messages_dropped, the barrier each test waits on)
// and the real ranks carry on.
#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>

#include "connector/connector_test_util.h"
#include "connector/manager_impl.h"
#include "connector/peer_auth.h"
#include "connector/protocol.h"
#include "connector/test_cluster.h"
#include "control/auth.h"
#include "transport/forwarding_transport.h"
#include "transport/region_token.h"

namespace kvbridge::internal {
namespace {

// Forwards everything; records the plain (handshake) messages sent and
// received, as someone on the wire would see them.
class TapTransport final : public ForwardingTransport {
 public:
  explicit TapTransport(std::unique_ptr<Transport> inner) : ForwardingTransport(std::move(inner)) {}
  // As a transport thread still delivering while its owner shuts down: the
  // first plain message of `replay_on_destroy_` received is handed to the
  // handler again as this transport is destroyed.
  ~TapTransport() override {
    if (replay_on_destroy_.empty() || !handler_) return;
    for (const std::string& b : received_) {
      Result<Message> m = DecodeMessage(b);
      if (m.ok() && MessageTypeName(m->body) == replay_on_destroy_) {
        handler_(b);
        if (replayed_out_ != nullptr) ++*replayed_out_;
        break;
      }
    }
  }
  void ReplayOnDestroy(std::string type, int* replayed) {
    replay_on_destroy_ = std::move(type);
    replayed_out_ = replayed;
  }
  void SetMessageHandler(MessageHandler h) override {
    handler_ = h;
    inner_->SetMessageHandler([this, h](std::string_view bytes) {
      if (!LooksSealed(bytes)) Record(&received_, bytes);
      h(bytes);
    });
  }
  Status SendMessage(PeerId p, std::string payload) override {
    if (!LooksSealed(payload)) Record(&sent_, payload);
    return inner_->SendMessage(p, std::move(payload));
  }

  // The first plain message of `type` sent (or received), waiting for it.
  std::string Sent(std::string_view type) { return Find(&sent_, type); }
  std::string Received(std::string_view type, size_t nth = 0) {
    return Find(&received_, type, nth);
  }

 private:
  void Record(std::vector<std::string>* log, std::string_view bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    log->emplace_back(bytes);
    cv_.notify_all();
  }
  std::string Find(std::vector<std::string>* log, std::string_view type, size_t nth = 0) {
    std::unique_lock<std::mutex> lock(mu_);
    std::string found;
    cv_.wait_for(lock, std::chrono::seconds(30), [&] {
      size_t seen = 0;
      for (const std::string& b : *log) {
        Result<Message> m = DecodeMessage(b);
        if (m.ok() && MessageTypeName(m->body) == type && seen++ == nth) {
          found = b;
          return true;
        }
      }
      return false;
    });
    return found;
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> sent_, received_;
  MessageHandler handler_;
  std::string replay_on_destroy_;
  int* replayed_out_ = nullptr;
};

// A process of the attacker's: a loopback transport on the cluster's fabric
// that keeps what it receives.
class Intruder {
 public:
  explicit Intruder(TestCluster& c)
      : t_(std::move(CreateLoopbackTransport(c.fabric(), "intruder")).value()) {
    t_->SetMessageHandler([this](std::string_view bytes) {
      std::lock_guard<std::mutex> lock(mu_);
      got_.emplace_back(bytes);
      cv_.notify_all();
    });
  }
  Transport& transport() { return *t_; }
  void Send(KVManager& to, std::string bytes) {
    const std::string& address = ManagerAccess::Of(to).transport().Address();
    if (!endpoints_.count(address)) endpoints_[address] = t_->Connect(address).value();
    ASSERT_TRUE(t_->SendMessage(endpoints_[address], std::move(bytes)).ok());
  }
  // The next message received, decoded (fails the test after 30 s).
  Message Next() {
    std::unique_lock<std::mutex> lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, std::chrono::seconds(30), [&] { return !got_.empty(); }));
    if (got_.empty()) return {};
    Result<Message> m = DecodeMessage(got_.front());
    got_.pop_front();
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? *m : Message{};
  }

 private:
  std::unique_ptr<Transport> t_;
  std::map<std::string, PeerId> endpoints_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> got_;
};

class PeerIdentityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ClusterOptions o;
    o.tweak = TolerantLiveness;
    o.wrap = [this](std::unique_ptr<Transport> t, Role role, int) -> std::unique_ptr<Transport> {
      if (role != Role::kDecode) return t;
      auto tap = std::make_unique<TapTransport>(std::move(t));
      decode_tap_ = tap.get();
      return tap;
    };
    auto c = TestCluster::Create(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    cluster_ = std::move(c).value();
    Deliver(1);  // the handshake is done
    intruder_ = std::make_unique<Intruder>(*cluster_);
  }
  KVManager& prefill() { return *cluster_->prefill[0].manager; }
  KVManager& decode() { return *cluster_->decode[0].manager; }
  static uint64_t Dropped(KVManager& m) { return m.Stats().unauthenticated_messages_dropped; }
  // A whole request, checked byte by byte.
  void Deliver(uint64_t room) {
    Request r{.room = room};
    r.src = {1, 2, 3};
    r.dst = {7, 8, 9};
    Start(*cluster_, r, false);
    SendChunks(r, {2, 1});
    ExpectDelivered(*cluster_, r);
  }
  // The decode peer prefill talks to: the real process, proven, working.
  void ExpectRealDecodePeer(PeerId endpoint) {
    bool found = false;
    for (const PeerSnapshot& p : ManagerAccess::Of(prefill()).Peers()) {
      if (!p.id.SameRank(decode().self())) continue;
      found = true;
      EXPECT_TRUE(SameProcess(p.id, decode().self())) << p.id.ToString();
      EXPECT_EQ(p.endpoint, endpoint);
      EXPECT_TRUE(p.ready && !p.failed);
    }
    EXPECT_TRUE(found);
  }
  PeerId PrefillEndpointToDecode() { return ProvenEndpoint(prefill(), decode().self()); }
  FailureRecord RecordAbout(const RankId& origin, const RankId& detector) {
    FailureRecord r;
    r.origin = origin;
    r.cause = FailureCause::kPeerUnresponsive;
    r.detail = "forged";
    r.phase = Phase::kTransferring;
    r.detected_by = detector;
    r.mechanism = "forgery";
    return r;
  }
  HelloMsg ForgedHello(uint64_t session = 0x5e55) {
    const ManagerImpl& d = ManagerAccess::Of(decode());
    HelloMsg h;
    h.layout = d.layout();
    h.tp_size = d.layout().tp_size;
    h.address = intruder_->transport().Address();
    h.kv_keys.assign(h.layout.kv.size(), "k");
    h.aux_keys.assign(h.layout.aux.size(), "k");
    h.state_keys.assign(h.layout.state.size(), "k");
    h.session = session;
    h.nonce.fill(3);
    // Tagged under the deployment's secret, as a Hello recorded on the
    // wire is: its address reaches prefill's connect back (an untagged one
    // does not: HostileHelloTest); what
    // follows the challenge needs the secret, which the forger lacks.
    h.address_tag =
        HandshakeAuth(AuthTokenFromEnvironment()).TagAddress(h.address, h.session, h.nonce);
    return h;
  }

  std::unique_ptr<TestCluster> cluster_;
  TapTransport* decode_tap_ = nullptr;
  std::unique_ptr<Intruder> intruder_;
};

// Before: a RankFailed naming the receiver fenced it ("this rank was
// declared failed"), from anyone; one naming a peer failed every request
// with it.
TEST_F(PeerIdentityTest, ForgedRankFailedFromAnUnprovenEndpointFencesNobody) {
  const uint64_t d0 = Dropped(decode()), p0 = Dropped(prefill());
  intruder_->Send(decode(),
                  EncodeMessage(prefill().self(),
                                RankFailedMsg{RecordAbout(decode().self(), prefill().self())}));
  intruder_->Send(
      prefill(),
      EncodeMessage(decode().self(), RankFailedMsg{RecordAbout(decode().self(), decode().self())}));
  ASSERT_TRUE(WaitFor([&] { return Dropped(decode()) > d0 && Dropped(prefill()) > p0; }));
  EXPECT_FALSE(ManagerAccess::Of(decode()).RecentRankFailure().has_value());
  EXPECT_FALSE(ManagerAccess::Of(prefill()).RecentRankFailure().has_value());
  Deliver(2);
}

// A rank that did prove itself still speaks only for itself: a message under
// its session naming another rank, or a RankFailed about another rank, is
// dropped too.
TEST_F(PeerIdentityTest, ProvenPeerCannotSpeakForAnotherRank) {
  const uint64_t p0 = Dropped(prefill());
  Transport& dt = ManagerAccess::Of(decode()).transport();
  const PeerId to_prefill = ProvenEndpoint(decode(), prefill().self());
  RankId other = decode().self();
  other.tp = 1;
  ASSERT_TRUE(
      dt.SendMessage(to_prefill, EncodeMessage(other, RankFailedMsg{RecordAbout(other, other)}))
          .ok());
  ASSERT_TRUE(dt.SendMessage(to_prefill, EncodeMessage(decode().self(),
                                                       RankFailedMsg{RecordAbout(prefill().self(),
                                                                                 decode().self())}))
                  .ok());
  ASSERT_TRUE(WaitFor([&] { return Dropped(prefill()) == p0 + 2; })) << Dropped(prefill()) - p0;
  EXPECT_FALSE(ManagerAccess::Of(prefill()).RecentRankFailure().has_value());
  Deliver(3);
}

// Before: a Hello claiming decode tp0 with a new incarnation made prefill
// fail the real decode peer ("restarted as pid ...") and drop its endpoint.
// Now the claim only earns a challenge, which cannot be answered without
// the secret.
TEST_F(PeerIdentityTest, ForgedHelloDoesNotEvictTheRealDecodePeer) {
  const PeerId endpoint = PrefillEndpointToDecode();
  RankId impostor = decode().self();
  impostor.incarnation += 1;
  impostor.pid += 1;
  intruder_->Send(prefill(), EncodeMessage(impostor, ForgedHello()));
  Message answer = intruder_->Next();  // prefill has handled the Hello
  auto* challenge = std::get_if<HelloChallengeMsg>(&answer.body);
  ASSERT_NE(challenge, nullptr) << "answered with " << MessageTypeName(answer.body);
  ExpectRealDecodePeer(endpoint);

  const uint64_t p0 = Dropped(prefill());
  const std::string hello = EncodeMessage(impostor, ForgedHello());
  const std::string t =
      HandshakeAuth::Transcript(Sha256(hello), answer.from, challenge->nonce, challenge->session);
  HandshakeAuth guess("not the deployment's secret");
  intruder_->Send(prefill(),
                  EncodeMessage(impostor, HelloProofMsg{challenge->session,
                                                        guess.Prove(Role::kDecode, t), hello}));
  ASSERT_TRUE(WaitFor([&] { return Dropped(prefill()) == p0 + 1; }));
  ExpectRealDecodePeer(endpoint);
  Deliver(4);
}

// Before: a Notify claiming prefill, with the request's room and generation
// (visible to anyone on the path) and last=true, turned decode's request to
// Success before a byte was written: decode handed corrupt pages on.
TEST_F(PeerIdentityTest, ForgedFinalNotifyBeforeItsDataIsDropped) {
  Request r{.room = 40};
  r.src = {1, 2, 3, 4};
  r.dst = {10, 11, 12, 13};
  Start(*cluster_, r, false);
  const uint64_t d0 = Dropped(decode());
  intruder_->Send(decode(), EncodeMessage(prefill().self(),
                                          NotifyMsg{r.room, r.receivers[0]->generation(), 0, true,
                                                    static_cast<uint32_t>(r.src.size())}));
  ASSERT_TRUE(WaitFor([&] { return Dropped(decode()) == d0 + 1; }));
  EXPECT_EQ(r.receivers[0]->Poll(), KVPoll::kWaitingForInput);
  SendChunks(r, {4});
  ExpectDelivered(*cluster_, r);
}

// Gives `hello` remote keys that import (the buffers it names, registered
// again on `t`), so that an accepted handshake is answered OK, not refused
// for its layout.
void WithImportableKeys(Transport& t, HelloMsg* hello) {
  auto keys = [&](const std::vector<BufferSpan>& spans, std::vector<std::string>* out) {
    out->clear();
    for (const BufferSpan& b : spans)
      out->push_back(t.RegisterMemory(reinterpret_cast<void*>(b.addr), b.length, MemoryKind::kDram)
                         .value()
                         .remote_key);
  };
  keys(hello->layout.kv, &hello->kv_keys);
  keys(hello->layout.aux, &hello->aux_keys);
  keys(hello->layout.state, &hello->state_keys);
}

// A handshake done right but under another secret is refused; the same
// handshake under the deployment's secret is accepted (its answer opens
// under the session it made), so the refusal is the secret's doing.
// A rank that joins with its own AuthTransport and plays decode's side of
// the handshake by hand, under `secret`.
class Newcomer {
 public:
  Newcomer(TestCluster& c, KVManager& prefill, const RankId& as, HelloMsg keyed_hello)
      : auth_(std::make_unique<AuthTransport>(
            std::move(CreateLoopbackTransport(c.fabric(), "newcomer")).value())),
        self_(as),
        keyed_(std::move(keyed_hello)) {
    auth_->SetAuthHandlers(
        [&](std::string_view bytes, const RankId* proven) {
          std::lock_guard<std::mutex> lock(mu_);
          got_.emplace_back(std::string(bytes), proven != nullptr);
          cv_.notify_all();
        },
        [](const Status&) {});
    to_prefill_ = auth_->Connect(ManagerAccess::Of(prefill).transport().Address()).value();
    WithImportableKeys(*auth_, &keyed_);
  }
  AuthTransport& auth() { return *auth_; }
  // The next message received and whether it came sealed (fails the test
  // after 30 s).
  std::pair<Message, bool> Next() {
    std::unique_lock<std::mutex> lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, std::chrono::seconds(30), [&] { return !got_.empty(); }));
    if (got_.empty()) return {};
    auto [bytes, sealed] = got_.front();
    got_.pop_front();
    return {std::move(DecodeMessage(bytes)).value(), sealed};
  }
  bool NothingReceived() {
    std::lock_guard<std::mutex> lock(mu_);
    return got_.empty();
  }
  // Sends a new Hello and takes prefill's challenge: its transcript, and the
  // session bound under `hs`'s keys.
  struct Challenged {
    HelloChallengeMsg challenge;
    std::string transcript;
    std::string hello;  // as sent
  };
  // `meanwhile` runs once the Hello left, before its challenge is awaited.
  Challenged Hello(const HandshakeAuth& hs, const std::function<void()>& meanwhile = {}) {
    HelloMsg hello = SendHello(hs);
    const std::string hello_bytes = EncodeMessage(self_, hello);
    if (meanwhile) meanwhile();
    auto [answer, sealed] = Next();
    const auto* c = std::get_if<HelloChallengeMsg>(&answer.body);
    EXPECT_NE(c, nullptr) << MessageTypeName(answer.body);
    EXPECT_FALSE(sealed);
    if (c == nullptr) return {};
    Challenged out{
        *c, HandshakeAuth::Transcript(Sha256(hello_bytes), answer.from, c->nonce, c->session),
        hello_bytes};
    const SessionKeys k = hs.Keys(out.transcript);
    // Where prefill's answer comes from: the endpoint it connected back on
    // is the one bound below (any endpoint of ours: the session id routes).
    auth_->Bind(to_prefill_,
                {k.decode_to_prefill, c->session, k.prefill_to_decode, hello.session, answer.from});
    prefill_ = answer.from;
    return out;
  }
  // Sends a new Hello, its address tagged under `hs`'s secret.
  HelloMsg SendHello(const HandshakeAuth& hs) {
    HelloMsg hello = keyed_;
    hello.address = auth_->Address();
    hello.session = SecureRandomU64().value();
    hello.nonce = NewNonce().value();
    hello.address_tag = hs.TagAddress(hello.address, hello.session, hello.nonce);
    EXPECT_TRUE(auth_->SendPlain(to_prefill_, EncodeMessage(self_, hello)).ok());
    return hello;
  }
  void Prove(const Challenged& c, const Digest& proof) {
    ASSERT_TRUE(auth_
                    ->SendPlain(to_prefill_, EncodeMessage(self_, HelloProofMsg{c.challenge.session,
                                                                                proof, c.hello}))
                    .ok());
  }
  const RankId& self() const { return self_; }

 private:
  std::unique_ptr<AuthTransport> auth_;
  RankId self_;
  HelloMsg keyed_;
  PeerId to_prefill_ = 0;
  RankId prefill_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::string, bool>> got_;  // bytes, sealed
};

// The newcomer's next message: a sealed HelloAck saying OK.
void ExpectSealedOk(Newcomer& newcomer) {
  auto [ack, ack_sealed] = newcomer.Next();
  const auto* verdict = std::get_if<HelloAckMsg>(&ack.body);
  ASSERT_NE(verdict, nullptr) << MessageTypeName(ack.body);
  EXPECT_EQ(verdict->code, StatusCode::kOk) << verdict->message;
  EXPECT_TRUE(ack_sealed);
}

// A rank of another instance (not met yet) at decode tp0's position.
RankId NewcomerAt(const RankId& decode) {
  RankId as = decode;
  as.instance = "newcomer";
  as.incarnation = 99;
  return as;
}

TEST_F(PeerIdentityTest, HandshakeUnderAnotherSecretIsRefusedUnderTheRightOneAccepted) {
  const PeerId endpoint = PrefillEndpointToDecode();
  const RankId as = NewcomerAt(decode().self());
  Newcomer newcomer(*cluster_, prefill(), as, ForgedHello());
  {
    // Its Hello is refused before prefill connects back to its address.
    const uint64_t p0 = Dropped(prefill());
    newcomer.SendHello(HandshakeAuth("another deployment's secret"));
    ASSERT_TRUE(WaitFor([&] { return Dropped(prefill()) == p0 + 1; }));
    EXPECT_TRUE(newcomer.NothingReceived()) << "prefill answered a Hello under another secret";
  }
  // A Hello tagged under the deployment's secret (recorded on the wire)
  // earns a challenge; a proof under another secret is refused.
  const HandshakeAuth deployment(AuthTokenFromEnvironment());
  for (const std::string& secret :
       {std::string("another deployment's secret"), AuthTokenFromEnvironment()}) {
    SCOPED_TRACE(secret == AuthTokenFromEnvironment() ? "the deployment's secret" : "another");
    HandshakeAuth hs(secret);
    const Newcomer::Challenged c = newcomer.Hello(deployment);
    EXPECT_EQ(hs.Verify(Role::kPrefill, c.transcript, c.challenge.proof, "prefill tp0").ok(),
              secret == AuthTokenFromEnvironment());
    const uint64_t p0 = Dropped(prefill());
    ASSERT_NO_FATAL_FAILURE(newcomer.Prove(c, hs.Prove(Role::kDecode, c.transcript)));
    if (secret != AuthTokenFromEnvironment()) {
      ASSERT_TRUE(WaitFor([&] { return Dropped(prefill()) == p0 + 1; }));
      EXPECT_TRUE(newcomer.NothingReceived()) << "prefill answered a proof under another secret";
      continue;
    }
    ASSERT_NO_FATAL_FAILURE(ExpectSealedOk(newcomer));
    EXPECT_EQ(Dropped(prefill()), p0);
  }
  ExpectRealDecodePeer(endpoint);
}

// Review finding: prefill took a pending challenge off its table before
// checking the proof, so anyone who saw the plain challenge could answer it
// with junk first and the real proof then answered nothing. The challenge
// now stays until a proof checks out.
TEST_F(PeerIdentityTest, AJunkProofDoesNotUseUpTheChallengeOfTheRealOne) {
  const RankId as = NewcomerAt(decode().self());
  Newcomer newcomer(*cluster_, prefill(), as, ForgedHello());
  HandshakeAuth hs(AuthTokenFromEnvironment());
  const Newcomer::Challenged c = newcomer.Hello(hs);
  const uint64_t p0 = Dropped(prefill());
  intruder_->Send(prefill(),
                  EncodeMessage(as, HelloProofMsg{c.challenge.session, Digest{}, c.hello}));
  ASSERT_TRUE(WaitFor([&] { return Dropped(prefill()) == p0 + 1; }));
  ASSERT_NO_FATAL_FAILURE(newcomer.Prove(c, hs.Prove(Role::kDecode, c.transcript)));
  ASSERT_NO_FATAL_FAILURE(ExpectSealedOk(newcomer));
  EXPECT_EQ(Dropped(prefill()), p0 + 1);
}

// Review finding (session 37): prefill kept at most 64 challenged Hellos and
// let the oldest go, so Hellos sent faster than one proof's round trip (no
// secret needed) pushed the genuine one out, and its proof answered
// nothing. Challenges are derived from the Hello now (ChallengeMaker) and the
// proof brings its Hello back: the genuine proof is taken after any number
// of Hellos, and taken once.
TEST_F(PeerIdentityTest, AFloodOfHellosDoesNotPushOutTheGenuineOne) {
  const RankId as = NewcomerAt(decode().self());
  Newcomer newcomer(*cluster_, prefill(), as, ForgedHello());
  HandshakeAuth hs(AuthTokenFromEnvironment());
  constexpr int kFlood = 200;  // > the 64 challenge endpoints prefill keeps
  auto flood = [&] {
    for (int i = 0; i < kFlood; ++i) {
      RankId flooder = decode().self();
      flooder.instance = "flooder";
      flooder.pid += 1 + i;
      HelloMsg h = ForgedHello(0x100000 + i);
      intruder_->Send(prefill(), EncodeMessage(flooder, h));
    }
  };
  // Sent right after the genuine Hello: most are handled before its
  // challenge has left (review: closing its endpoint then dropped it).
  const Newcomer::Challenged c = newcomer.Hello(hs, flood);
  // The same flood again (replayed Hellos) between the challenge and its
  // proof. Every challenge leaves, none dropped by the endpoints let go.
  flood();
  for (int i = 0; i < 2 * kFlood; ++i) {
    const Message m = intruder_->Next();
    ASSERT_TRUE(std::holds_alternative<HelloChallengeMsg>(m.body)) << MessageTypeName(m.body);
  }
  const uint64_t p0 = Dropped(prefill());
  const Digest proof = hs.Prove(Role::kDecode, c.transcript);
  ASSERT_NO_FATAL_FAILURE(newcomer.Prove(c, proof));
  ASSERT_NO_FATAL_FAILURE(ExpectSealedOk(newcomer));
  // The same proof again (recorded on the wire) proves nothing more.
  ASSERT_NO_FATAL_FAILURE(newcomer.Prove(c, proof));
  ASSERT_TRUE(WaitFor([&] { return Dropped(prefill()) == p0 + 1; }));
  EXPECT_TRUE(newcomer.NothingReceived()) << "a replayed proof was answered";
}

// A proof whose Hello is not its sender's, or is no Hello, proves nothing:
// the challenge is derived from the Hello the proof carries.
TEST_F(PeerIdentityTest, AProofMustCarryItsSendersHello) {
  const RankId as = NewcomerAt(decode().self());
  Newcomer newcomer(*cluster_, prefill(), as, ForgedHello());
  HandshakeAuth hs(AuthTokenFromEnvironment());
  const Newcomer::Challenged c = newcomer.Hello(hs);
  const Digest proof = hs.Prove(Role::kDecode, c.transcript);
  RankId other = as;
  other.pid += 1;
  const uint64_t p0 = Dropped(prefill());
  for (const std::string& carried :
       {std::string(), EncodeMessage(as, HeartbeatMsg{1}), c.hello.substr(1)}) {
    intruder_->Send(prefill(),
                    EncodeMessage(as, HelloProofMsg{c.challenge.session, proof, carried}));
  }
  // The right Hello under another sender's name.
  intruder_->Send(prefill(),
                  EncodeMessage(other, HelloProofMsg{c.challenge.session, proof, c.hello}));
  ASSERT_TRUE(WaitFor([&] { return Dropped(prefill()) == p0 + 4; })) << Dropped(prefill()) - p0;
  EXPECT_TRUE(newcomer.NothingReceived());
  // The genuine proof still goes through.
  ASSERT_NO_FATAL_FAILURE(newcomer.Prove(c, proof));
  ASSERT_NO_FATAL_FAILURE(ExpectSealedOk(newcomer));
}

// A handshake recorded on the wire and replayed: the Hello earns a new
// challenge (with a new nonce, sent to the real decode rank, which answers
// no challenge it did not ask for); the recorded proof answers no open
// challenge, and pointed at the new one it proves nothing.
TEST_F(PeerIdentityTest, ReplayedHandshakeIsRefused) {
  const PeerId endpoint = PrefillEndpointToDecode();
  const std::string hello = decode_tap_->Sent("Hello");
  const std::string proof = decode_tap_->Sent("HelloProof");
  ASSERT_FALSE(hello.empty());
  ASSERT_FALSE(proof.empty());
  const uint64_t stale0 = decode().Stats().stale_messages_dropped;
  intruder_->Send(prefill(), hello);
  // The new challenge reached the real decode rank, which dropped it.
  const std::string challenge_bytes = decode_tap_->Received("HelloChallenge", 1);
  ASSERT_FALSE(challenge_bytes.empty());
  ASSERT_TRUE(WaitFor([&] { return decode().Stats().stale_messages_dropped > stale0; }));
  const Message challenge = DecodeMessage(challenge_bytes).value();
  const uint64_t fresh_session = std::get<HelloChallengeMsg>(challenge.body).session;

  const uint64_t p0 = Dropped(prefill());
  intruder_->Send(prefill(), proof);
  Message recorded = DecodeMessage(proof).value();
  std::get<HelloProofMsg>(recorded.body).session = fresh_session;
  intruder_->Send(prefill(), EncodeMessage(recorded.from, recorded.body));
  ASSERT_TRUE(WaitFor([&] { return Dropped(prefill()) == p0 + 2; })) << Dropped(prefill()) - p0;
  ExpectRealDecodePeer(endpoint);
  Deliver(5);
}

// A message that a transport thread delivers while the manager shuts down
// is dropped: a Hello, answered at once with a connect back, once reached
// the transport while the destructor took it down (SIGSEGV on a null inner
// transport in a clean-clone run of PpTest.LayoutMismatch*).
TEST(ManagerShutdownTest, AMessageDeliveredDuringShutdownTouchesNoTransport) {
  int replayed = 0;
  {
    ClusterOptions o;
    o.tweak = TolerantLiveness;
    o.wrap = [&](std::unique_ptr<Transport> t, Role role, int) -> std::unique_ptr<Transport> {
      if (role != Role::kPrefill) return t;
      auto tap = std::make_unique<TapTransport>(std::move(t));
      tap->ReplayOnDestroy("Hello", &replayed);
      return tap;
    };
    auto c = TestCluster::Create(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    Request r{.room = 1};
    r.src = {1, 2};
    r.dst = {5, 6};
    Start(**c, r, false);
    SendChunks(r, {2});
    ExpectDelivered(**c, r);
  }  // the cluster goes; prefill's transport replays decode's Hello as it does
  EXPECT_EQ(replayed, 1);
}

}  // namespace
}  // namespace kvbridge::internal
