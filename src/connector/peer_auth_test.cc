// The handshake's cryptography and the sealed channel (peer_auth.h,
// auth_transport.h), without managers: proofs hold only under the same
// secret and the same fresh nonces; a sealed message opens only under its
// session, once.
#include "connector/peer_auth.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "connector/auth_transport.h"
#include "transport/forwarding_transport.h"
#include "transport/loopback/loopback_transport.h"

namespace kvbridge::internal {
namespace {

RankId Prefill(uint64_t incarnation = 11) {
  RankId id;
  id.role = Role::kPrefill;
  id.tp = 1;
  id.host = "host-a";
  id.pid = 4242;
  id.incarnation = incarnation;
  return id;
}

Nonce NonceOf(uint8_t fill) {
  Nonce n;
  n.fill(fill);
  return n;
}

const Digest kHello = Sha256("a decode rank's Hello, as sent");

// A challenge is derived, not kept: the same Hello in the same window gets
// the same one, and it is found again from the Hello and its session id in
// its window and the next, never later, never under another key or for
// another Hello.
TEST(ChallengeMakerTest, AChallengeIsFoundAgainInItsWindowAndTheNextOnly) {
  std::array<uint8_t, 32> key{};
  key.fill(7);
  const ChallengeMaker maker(key);
  const Digest hello = Sha256("a Hello");
  const SteadyTime t0{std::chrono::seconds(3000)};  // the start of a window
  const Challenge c = maker.For(hello, t0);
  EXPECT_NE(c.session, 0u);
  const Challenge again = maker.For(hello, t0 + std::chrono::seconds(29));
  EXPECT_EQ(again.session, c.session);
  EXPECT_EQ(again.nonce, c.nonce);
  const Challenge other = maker.For(Sha256("another Hello"), t0);
  EXPECT_NE(other.session, c.session);
  EXPECT_NE(other.nonce, c.nonce);
  EXPECT_NE(maker.For(hello, t0 + ChallengeMaker::kWindow).session, c.session);

  for (auto later : {std::chrono::seconds(0), std::chrono::seconds(31), std::chrono::seconds(59)}) {
    const std::optional<Challenge> found = maker.Find(hello, c.session, t0 + later);
    ASSERT_TRUE(found.has_value()) << later.count() << " s later";
    EXPECT_EQ(found->nonce, c.nonce);
  }
  EXPECT_FALSE(maker.Find(hello, c.session, t0 + std::chrono::seconds(60)).has_value());
  EXPECT_FALSE(maker.Find(hello, c.session, t0 - std::chrono::seconds(1)).has_value());
  EXPECT_FALSE(maker.Find(Sha256("another Hello"), c.session, t0).has_value());
  EXPECT_FALSE(maker.Find(hello, c.session + 1, t0).has_value());
  key[0] ^= 1;
  EXPECT_FALSE(ChallengeMaker(key).Find(hello, c.session, t0).has_value());
  // Two processes' makers (fresh keys) give different challenges.
  EXPECT_NE(ChallengeMaker::Create()->For(hello, t0).session,
            ChallengeMaker::Create()->For(hello, t0).session);
}

TEST(HandshakeAuthTest, ProofVerifiesUnderTheSameSecretAndTranscriptOnly) {
  HandshakeAuth ours("secret-of-this-deployment");
  const std::string t = HandshakeAuth::Transcript(kHello, Prefill(), NonceOf(1), 77);
  const Digest proof = ours.Prove(Role::kPrefill, t);
  EXPECT_TRUE(ours.Verify(Role::kPrefill, t, proof, "prefill tp1").ok());
  // The other side's label: a proof cannot be reflected back as the peer's.
  EXPECT_EQ(ours.Verify(Role::kDecode, t, proof, "decode tp0").code(),
            StatusCode::kUnauthenticated);
  // Each part of the transcript counts.
  for (const std::string& other :
       {HandshakeAuth::Transcript(Sha256("another Hello"), Prefill(), NonceOf(1), 77),
        HandshakeAuth::Transcript(kHello, Prefill(12), NonceOf(1), 77),
        HandshakeAuth::Transcript(kHello, Prefill(), NonceOf(2), 77),
        HandshakeAuth::Transcript(kHello, Prefill(), NonceOf(1), 78)}) {
    EXPECT_EQ(ours.Verify(Role::kPrefill, other, proof, "prefill tp1").code(),
              StatusCode::kUnauthenticated);
  }
}

// A rank of another deployment (or one whose secret was mistyped) is refused
// with a message that names what to set.
TEST(HandshakeAuthTest, WrongSecretIsRefusedNamingTheVariable) {
  HandshakeAuth ours("secret-of-this-deployment"), theirs("another-secret");
  const std::string t = HandshakeAuth::Transcript(kHello, Prefill(), NonceOf(1), 77);
  Status s = ours.Verify(Role::kPrefill, t, theirs.Prove(Role::kPrefill, t), "prefill tp1");
  ASSERT_EQ(s.code(), StatusCode::kUnauthenticated);
  EXPECT_NE(s.message().find("handshake with prefill tp1"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("KVBRIDGE_AUTH_TOKEN"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN"), std::string::npos)
      << s.message();
}

// A recorded handshake replayed: the prover answers a challenge with a new
// nonce, and the old proof is not a proof over it.
TEST(HandshakeAuthTest, ReplayedProofOverAnOldNonceFails) {
  HandshakeAuth auth("secret");
  const std::string old_t = HandshakeAuth::Transcript(kHello, Prefill(), NonceOf(1), 77);
  const Digest recorded = auth.Prove(Role::kDecode, old_t);
  Result<Nonce> fresh = NewNonce();
  ASSERT_TRUE(fresh.ok());
  ASSERT_NE(*fresh, NonceOf(1));
  const std::string new_t = HandshakeAuth::Transcript(kHello, Prefill(), *fresh, 77);
  EXPECT_EQ(auth.Verify(Role::kDecode, new_t, recorded, "decode tp0").code(),
            StatusCode::kUnauthenticated);
}

TEST(HandshakeAuthTest, SessionKeysDifferPerDirectionAndPerHandshake) {
  HandshakeAuth auth("secret");
  const std::string t1 = HandshakeAuth::Transcript(kHello, Prefill(), NonceOf(1), 77);
  const std::string t2 = HandshakeAuth::Transcript(kHello, Prefill(), NonceOf(2), 77);
  const SessionKeys k1 = auth.Keys(t1), k2 = auth.Keys(t2);
  EXPECT_NE(k1.decode_to_prefill, k1.prefill_to_decode);
  EXPECT_NE(k1.decode_to_prefill, k2.decode_to_prefill);
  EXPECT_EQ(k1.decode_to_prefill, auth.Keys(t1).decode_to_prefill);  // both sides agree
  EXPECT_NE(k1.decode_to_prefill, HandshakeAuth("other").Keys(t1).decode_to_prefill);
}

TEST(HmacTest, MatchesRfc4231TestCase2) {
  // RFC 4231, test case 2 (key "Jefe", 4 bytes; here zero-padded to 32,
  // which HMAC treats the same as the short key).
  std::array<uint8_t, 32> key{};
  std::memcpy(key.data(), "Jefe", 4);
  const Digest mac = HmacSha256(key, "what do ya want for nothing?");
  const uint8_t expected[] = {0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e, 0x6a, 0x04, 0x24,
                              0x26, 0x08, 0x95, 0x75, 0xc7, 0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27,
                              0x39, 0x83, 0x9d, 0xec, 0x58, 0xb9, 0x64, 0xec, 0x38, 0x43};
  EXPECT_EQ(0, std::memcmp(mac.data(), expected, sizeof(expected)));
}

SessionKey KeyOf(uint8_t fill) {
  SessionKey k;
  k.fill(fill);
  return k;
}

TEST(SealTest, OpensUnderItsKeyOnlyAndEveryByteCounts) {
  const SealedHeader h{SealLane::kUrgent, 0x1234, 9};
  const std::string sealed = Seal(KeyOf(1), h, "payload bytes");
  ASSERT_TRUE(LooksSealed(sealed));
  Result<SealedHeader> parsed = ParseSealed(sealed);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->lane, SealLane::kUrgent);
  EXPECT_EQ(parsed->session, 0x1234u);
  EXPECT_EQ(parsed->seq, 9u);
  Result<std::string_view> opened = OpenSealed(KeyOf(1), sealed);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_EQ(*opened, "payload bytes");
  EXPECT_EQ(OpenSealed(KeyOf(2), sealed).status().code(), StatusCode::kUnauthenticated);
  for (size_t i = 4; i < sealed.size(); ++i) {
    std::string bad = sealed;
    bad[i] ^= 0x01;
    Result<std::string_view> r = OpenSealed(KeyOf(1), bad);
    EXPECT_FALSE(r.ok()) << "byte " << i << " flipped still opened";
  }
}

TEST(SealTest, ShortOrForeignBytesAreRefusedWithTheReason) {
  const std::string sealed = Seal(KeyOf(1), {SealLane::kOrdered, 1, 0}, "");
  EXPECT_EQ(ParseSealed(sealed.substr(0, sealed.size() - 1)).status().code(),
            StatusCode::kInvalidArgument);
  std::string lane = sealed;
  lane[4] = 7;
  Result<SealedHeader> r = ParseSealed(lane);
  ASSERT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("unknown lane 7"), std::string::npos);
  EXPECT_FALSE(LooksSealed("KVBM plain"));
}

TEST(ReplayWindowTest, EachNumberOnceAndNoneTooOld) {
  ReplayWindow w;
  EXPECT_TRUE(w.Accept(0));
  EXPECT_FALSE(w.Accept(0));
  EXPECT_TRUE(w.Accept(2));
  EXPECT_TRUE(w.Accept(1));  // overtaken by a racing sender thread
  EXPECT_FALSE(w.Accept(1));
  EXPECT_FALSE(w.Accept(2));
  const uint64_t far = 2 + ReplayWindow::kReplayWindow;
  EXPECT_TRUE(w.Accept(far));
  EXPECT_FALSE(w.Accept(2));  // out of the window now
  EXPECT_TRUE(w.Accept(far - 1));
  EXPECT_FALSE(w.Accept(far - ReplayWindow::kReplayWindow));
  EXPECT_TRUE(w.Accept(far - ReplayWindow::kReplayWindow + 1));
  EXPECT_TRUE(w.Accept(far + 5 * ReplayWindow::kReplayWindow));
  EXPECT_FALSE(w.Accept(far));
}

// What an AuthTransport hands up, in order.
struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<std::string, std::optional<RankId>>> got;
  std::deque<Status> refused;
  void Install(AuthTransport& t) {
    t.SetAuthHandlers(
        [this](std::string_view bytes, const RankId* proven) {
          std::lock_guard<std::mutex> lock(mu);
          got.emplace_back(std::string(bytes),
                           proven ? std::optional<RankId>(*proven) : std::nullopt);
          cv.notify_all();
        },
        [this](const Status& why) {
          std::lock_guard<std::mutex> lock(mu);
          refused.push_back(why);
          cv.notify_all();
        });
  }
  bool WaitTotal(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(10),
                       [&] { return got.size() + refused.size() >= n; });
  }
};

class AuthTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fabric_ = std::make_shared<LoopbackFabric>();
    const auto& fabric = fabric_;
    receiver_ = std::make_unique<AuthTransport>(
        std::move(CreateLoopbackTransport(fabric, "receiver")).value());
    inbox_.Install(*receiver_);
    sender_ = std::make_unique<AuthTransport>(
        std::move(CreateLoopbackTransport(fabric, "sender")).value());
    sender_->SetAuthHandlers([](std::string_view, const RankId*) {}, [](const Status&) {});
    raw_ = std::move(CreateLoopbackTransport(fabric, "raw")).value();
    raw_->SetMessageHandler([](std::string_view) {});
    to_receiver_ = sender_->Connect(receiver_->Address()).value();
    raw_to_receiver_ = raw_->Connect(receiver_->Address()).value();
    back_ = receiver_->Connect(sender_->Address()).value();
    // The receiver's side of the session, as a handshake would bind it.
    receiver_->Bind(back_, {KeyOf(2), 0x51, KeyOf(1), 0x52, Prefill()});
  }

  std::shared_ptr<LoopbackFabric> fabric_;
  std::unique_ptr<AuthTransport> receiver_, sender_;
  std::unique_ptr<Transport> raw_;
  Inbox inbox_;
  PeerId to_receiver_ = 0, raw_to_receiver_ = 0, back_ = 0;
};

TEST_F(AuthTransportTest, NothingButPlainLeavesAnEndpointWithoutASession) {
  Status s = sender_->SendMessage(to_receiver_, "hello");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("no authenticated session"), std::string::npos) << s.message();
  EXPECT_EQ(sender_->SendUrgentMessage(to_receiver_, "x").code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(sender_->SendPlain(to_receiver_, "plain").ok());
  ASSERT_TRUE(inbox_.WaitTotal(1));
  std::lock_guard<std::mutex> lock(inbox_.mu);
  ASSERT_EQ(inbox_.got.size(), 1u);
  EXPECT_EQ(inbox_.got[0].first, "plain");
  EXPECT_FALSE(inbox_.got[0].second.has_value());
}

TEST_F(AuthTransportTest, SealedMessagesOpenAsTheirSessionsRankOnceEach) {
  sender_->Bind(to_receiver_, {KeyOf(1), 0x52, KeyOf(2), 0x51, RankId{}});
  ASSERT_TRUE(sender_->SendMessage(to_receiver_, "one").ok());
  ASSERT_TRUE(sender_->SendUrgentMessage(to_receiver_, "two").ok());
  ASSERT_TRUE(sender_->SendMessageUnfenced(to_receiver_, "three").ok());
  ASSERT_TRUE(inbox_.WaitTotal(3));
  // A third party replays the sender's first message (what it would have
  // sniffed), then forges one under the session with another key, then one
  // for a session nobody opened.
  ASSERT_TRUE(
      raw_->SendMessage(raw_to_receiver_, Seal(KeyOf(1), {SealLane::kOrdered, 0x52, 0}, "one"))
          .ok());
  ASSERT_TRUE(
      raw_->SendMessage(raw_to_receiver_, Seal(KeyOf(9), {SealLane::kOrdered, 0x52, 7}, "forged"))
          .ok());
  ASSERT_TRUE(
      raw_->SendMessage(raw_to_receiver_, Seal(KeyOf(1), {SealLane::kOrdered, 0x99, 0}, "lost"))
          .ok());
  ASSERT_TRUE(inbox_.WaitTotal(6));
  std::lock_guard<std::mutex> lock(inbox_.mu);
  ASSERT_EQ(inbox_.got.size(), 3u);
  std::vector<std::string> texts;
  for (auto& [text, proven] : inbox_.got) {
    texts.push_back(text);
    ASSERT_TRUE(proven.has_value());
    EXPECT_TRUE(SameProcess(*proven, Prefill()));
  }
  std::sort(texts.begin(), texts.end());
  EXPECT_EQ(texts, (std::vector<std::string>{"one", "three", "two"}));
  ASSERT_EQ(inbox_.refused.size(), 3u);
  for (const Status& s : inbox_.refused) EXPECT_EQ(s.code(), StatusCode::kUnauthenticated);
  EXPECT_NE(inbox_.refused[0].message().find("replayed"), std::string::npos)
      << inbox_.refused[0].message();
  EXPECT_NE(inbox_.refused[1].message().find("tag"), std::string::npos)
      << inbox_.refused[1].message();
  EXPECT_NE(inbox_.refused[2].message().find("no handshake opened"), std::string::npos)
      << inbox_.refused[2].message();
}

TEST_F(AuthTransportTest, DisconnectForgetsTheSession) {
  receiver_->Disconnect(back_);
  ASSERT_TRUE(
      raw_->SendMessage(raw_to_receiver_, Seal(KeyOf(1), {SealLane::kOrdered, 0x52, 0}, "late"))
          .ok());
  ASSERT_TRUE(inbox_.WaitTotal(1));
  std::lock_guard<std::mutex> lock(inbox_.mu);
  EXPECT_TRUE(inbox_.got.empty());
  ASSERT_EQ(inbox_.refused.size(), 1u);
  EXPECT_NE(inbox_.refused[0].message().find("no handshake opened"), std::string::npos);
}

TEST_F(AuthTransportTest, ASharedEndpointSealsUnderItsMainSessionWithoutReusingNumbers) {
  const PeerId beat = sender_->Connect(receiver_->Address()).value();
  EXPECT_EQ(sender_->SendUrgentMessage(beat, "x").code(), StatusCode::kFailedPrecondition);
  sender_->Bind(to_receiver_, {KeyOf(1), 0x52, KeyOf(2), 0x51, RankId{}});
  sender_->Share(beat, to_receiver_);
  // Urgent messages on both endpoints: one lane's numbers, none replayed.
  ASSERT_TRUE(sender_->SendUrgentMessage(to_receiver_, "main").ok());
  ASSERT_TRUE(sender_->SendUrgentMessage(beat, "beat").ok());
  ASSERT_TRUE(inbox_.WaitTotal(2));
  {
    std::lock_guard<std::mutex> lock(inbox_.mu);
    EXPECT_TRUE(inbox_.refused.empty()) << inbox_.refused[0].ToString();
    ASSERT_EQ(inbox_.got.size(), 2u);
    for (auto& [text, proven] : inbox_.got) {
      ASSERT_TRUE(proven.has_value()) << text;
      EXPECT_TRUE(SameProcess(*proven, Prefill()));
    }
  }
  // Gone with its main endpoint.
  sender_->Disconnect(to_receiver_);
  EXPECT_EQ(sender_->SendUrgentMessage(beat, "late").code(), StatusCode::kFailedPrecondition);
}

// Keeps the urgent messages sent through it, by endpoint, instead of
// sending them: a test delivers them in the order a network could.
class KeepUrgent final : public ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  Status SendUrgentMessage(PeerId p, std::string payload) override {
    kept[p].push_back(std::move(payload));
    return Status();
  }
  std::map<PeerId, std::vector<std::string>> kept;
};

// Review finding: the heartbeat endpoint took its numbers from the main
// endpoint's urgent lane. A burst of urgent notices queued behind writes on
// the main connection, overtaken by the next beat on the idle one, was cut
// by the replay window: the first of the burst were refused as too old.
TEST_F(AuthTransportTest, ABeatThatOvertakesABurstOnTheMainEndpointCutsNothingFromIt) {
  auto keep = std::make_unique<KeepUrgent>(
      std::move(CreateLoopbackTransport(fabric_, "burst sender")).value());
  KeepUrgent& wire = *keep;
  AuthTransport sender(std::move(keep));
  sender.SetAuthHandlers([](std::string_view, const RankId*) {}, [](const Status&) {});
  const PeerId main = sender.Connect(receiver_->Address()).value();
  const PeerId beat = sender.Connect(receiver_->Address()).value();
  sender.Bind(main, {KeyOf(1), 0x52, KeyOf(2), 0x51, RankId{}});
  sender.Share(beat, main);
  constexpr size_t kBurst = ReplayWindow::kReplayWindow + 76;
  for (size_t i = 0; i < kBurst; ++i) ASSERT_TRUE(sender.SendUrgentMessage(main, "notice").ok());
  ASSERT_TRUE(sender.SendUrgentMessage(beat, "beat").ok());
  ASSERT_EQ(wire.kept[main].size(), kBurst);
  ASSERT_EQ(wire.kept[beat].size(), 1u);
  // The beat arrives first, then the burst.
  ASSERT_TRUE(raw_->SendMessage(raw_to_receiver_, wire.kept[beat][0]).ok());
  for (const std::string& bytes : wire.kept[main])
    ASSERT_TRUE(raw_->SendMessage(raw_to_receiver_, bytes).ok());
  ASSERT_TRUE(inbox_.WaitTotal(kBurst + 1));
  std::lock_guard<std::mutex> lock(inbox_.mu);
  EXPECT_EQ(inbox_.got.size(), kBurst + 1);
  EXPECT_TRUE(inbox_.refused.empty())
      << inbox_.refused.size() << " refused, the first: " << inbox_.refused[0].ToString();
}

// Forwards everything to `inner`, except that the first SendMessage waits
// before handing its bytes over until `others` more sends went through (or
// `hold` passed): a sender thread preempted between sealing its message and
// queueing it while other threads keep sending.
class HoldFirstSend final : public ForwardingTransport {
 public:
  HoldFirstSend(std::unique_ptr<Transport> inner, int others, std::chrono::milliseconds hold)
      : ForwardingTransport(std::move(inner)), others_(others), hold_(hold) {}
  // Until the first SendMessage is held (false after 10 s).
  bool WaitHolding() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return holding_; });
  }
  Status SendMessage(PeerId p, std::string payload) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!holding_) {
        holding_ = true;
        cv_.notify_all();
        cv_.wait_for(lock, hold_, [&] { return passed_ >= others_; });
      } else {
        ++passed_;
        cv_.notify_all();
      }
    }
    return inner_->SendMessage(p, std::move(payload));
  }

 private:
  const int others_;
  const std::chrono::milliseconds hold_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool holding_ = false;
  int passed_ = 0;
};

// A message numbered before others reaches the receiver before them, even
// when its thread stalls between sealing and sending while another thread
// sends more than the replay window's worth: the receiver refuses nothing
// (10,000 rooms in flight lost a room's metadata to "replayed or too old").
TEST(AuthTransportOrderTest, MessagesLeaveInTheOrderOfTheirNumbersWhicheverThreadSends) {
  constexpr int kOthers = static_cast<int>(ReplayWindow::kReplayWindow) + 100;
  auto fabric = std::make_shared<LoopbackFabric>();
  AuthTransport receiver(std::move(CreateLoopbackTransport(fabric, "receiver")).value());
  Inbox inbox;
  inbox.Install(receiver);
  auto held =
      std::make_unique<HoldFirstSend>(std::move(CreateLoopbackTransport(fabric, "sender")).value(),
                                      kOthers, std::chrono::milliseconds(500));
  HoldFirstSend* hold = held.get();
  AuthTransport sender(std::move(held));
  sender.SetAuthHandlers([](std::string_view, const RankId*) {}, [](const Status&) {});
  const PeerId to_receiver = sender.Connect(receiver.Address()).value();
  const PeerId back = receiver.Connect(sender.Address()).value();
  receiver.Bind(back, {KeyOf(2), 0x51, KeyOf(1), 0x52, Prefill()});
  sender.Bind(to_receiver, {KeyOf(1), 0x52, KeyOf(2), 0x51, RankId{}});

  std::thread first([&] { EXPECT_TRUE(sender.SendMessage(to_receiver, "first").ok()); });
  ASSERT_TRUE(hold->WaitHolding());  // "first" has its number, not yet sent
  std::thread others([&] {
    for (int i = 0; i < kOthers; ++i)
      EXPECT_TRUE(sender.SendMessage(to_receiver, std::to_string(i)).ok());
  });
  first.join();
  others.join();
  ASSERT_TRUE(inbox.WaitTotal(kOthers + 1));
  std::lock_guard<std::mutex> lock(inbox.mu);
  EXPECT_TRUE(inbox.refused.empty())
      << inbox.refused.size() << " refused, the first: " << inbox.refused.front().ToString();
  ASSERT_EQ(inbox.got.size(), static_cast<size_t>(kOthers + 1));
  EXPECT_EQ(inbox.got.front().first, "first");
  for (int i = 0; i < kOthers; ++i) EXPECT_EQ(inbox.got[i + 1].first, std::to_string(i));
}

}  // namespace
}  // namespace kvbridge::internal
