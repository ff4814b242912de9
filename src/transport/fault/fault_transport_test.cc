#include "transport/fault/fault_transport.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "transport/loopback/loopback_transport.h"
#include "transport/test_util.h"

namespace kvbridge::internal {
namespace {

using ::kvbridge::internal::testing::Completions;
using ::kvbridge::internal::testing::Failures;
using ::kvbridge::internal::testing::Gate;
using ::testing::HasSubstr;
using Ms = std::chrono::milliseconds;

// Messages received by one target, with whether the watched bytes were
// already written when each arrived.
class Inbox {
 public:
  explicit Inbox(const std::vector<uint8_t>* dst, const std::vector<uint8_t>* src)
      : dst_(dst), src_(src) {}
  MessageHandler Handler() {
    return [this](std::string_view payload) {
      std::lock_guard<std::mutex> lock(mu_);
      bool visible = std::equal(src_->begin(), src_->begin() + 64, dst_->begin());
      got_.emplace_back(std::string(payload), visible);
      cv_.notify_all();
    };
  }
  // Waits for `payload`, returns everything received so far.
  std::vector<std::pair<std::string, bool>> WaitFor(const std::string& payload) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] {
      for (auto& [p, v] : got_)
        if (p == payload) return true;
      return false;
    });
    return got_;
  }
  std::vector<std::pair<std::string, bool>> Got() {
    std::lock_guard<std::mutex> lock(mu_);
    return got_;
  }

 private:
  const std::vector<uint8_t>* dst_;
  const std::vector<uint8_t>* src_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<std::string, bool>> got_;
};

// fault(loopback "prefill") -> loopback "decode" (peer) and "decode2" (other).
// Members the transports' callbacks use are declared first.
struct Harness {
  static constexpr size_t kSize = 4096;
  std::vector<uint8_t> src = std::vector<uint8_t>(kSize);
  std::vector<uint8_t> dst = std::vector<uint8_t>(kSize, 0);
  std::vector<uint8_t> dst2 = std::vector<uint8_t>(kSize, 0);
  Inbox inbox{&dst, &src};
  Inbox inbox2{&dst2, &src};
  Failures failures;
  std::shared_ptr<LoopbackFabric> fabric = std::make_shared<LoopbackFabric>();
  std::unique_ptr<Transport> decode;
  std::unique_ptr<Transport> decode2;
  std::unique_ptr<FaultTransport> f;
  RegionId local = 0;
  PeerId peer = 0;
  PeerId other = 0;
  RemoteRegionId remote = 0;
  RemoteRegionId remote2 = 0;

  Harness() {
    for (size_t i = 0; i < kSize; ++i) src[i] = static_cast<uint8_t>(i * 5 + 3);
    decode = CreateLoopbackTransport(fabric, "decode").value();
    decode2 = CreateLoopbackTransport(fabric, "decode2").value();
    f = std::make_unique<FaultTransport>(CreateLoopbackTransport(fabric, "prefill").value());
    decode->SetMessageHandler(inbox.Handler());
    decode2->SetMessageHandler(inbox2.Handler());
    f->SetPeerFailureHandler(failures.Handler());
    local = f->RegisterMemory(src.data(), kSize, MemoryKind::kDram).value().id;
    std::string key =
        decode->RegisterMemory(dst.data(), kSize, MemoryKind::kDram).value().remote_key;
    std::string key2 =
        decode2->RegisterMemory(dst2.data(), kSize, MemoryKind::kDram).value().remote_key;
    peer = f->Connect(decode->Address()).value();
    other = f->Connect(decode2->Address()).value();
    remote = f->ImportRegion(peer, key).value();
    remote2 = f->ImportRegion(other, key2).value();
  }
  WriteOp Op(uint64_t off, uint64_t len) const { return {local, off, remote, off, len}; }
  bool Written() const { return std::equal(src.begin(), src.begin() + 64, dst.begin()); }
  bool Untouched() const {
    return std::all_of(dst.begin(), dst.end(), [](uint8_t v) { return v == 0; });
  }
  // Waits until every task the wrapper queued so far has run: a failed
  // batch to `other` travels through the same worker.
  void Flush() {
    Completions c;
    f->FailWrites(other, InternalError("flush"));
    ASSERT_TRUE(f->PostWrites(other, {{local, 0, remote2, 0, 1}}, c.Callback()).ok());
    c.Wait(1);
    f->FailWrites(other, Status::Ok());
  }
};

struct FaultCase {
  const char* name;
  std::function<void(FaultTransport&, PeerId peer, PeerId other)> inject;
  std::function<void(Harness&)> after_post;  // may be empty
  StatusCode post_code;
  StatusCode done_code;
  const char* done_message;  // substring
  bool written;
  bool delivered;
  uint64_t FaultCounters::*counter;  // expected to be 1
};

std::vector<FaultCase> FaultCases() {
  return {
      {"no fault", [](FaultTransport&, PeerId, PeerId) {}, nullptr, StatusCode::kOk,
       StatusCode::kOk, "", true, true, &FaultCounters::batches_forwarded},
      {"fail all peers",
       [](FaultTransport& f, PeerId, PeerId) {
         f.FailWrites(FaultTransport::kAllPeers, DataLossError("injected corruption"));
       },
       nullptr, StatusCode::kOk, StatusCode::kDataLoss, "injected corruption", false, true,
       &FaultCounters::batches_failed},
      {"fail this peer",
       [](FaultTransport& f, PeerId p, PeerId) { f.FailWrites(p, UnavailableError("link down")); },
       nullptr, StatusCode::kOk, StatusCode::kUnavailable, "link down", false, true,
       &FaultCounters::batches_failed},
      {"fail another peer only",
       [](FaultTransport& f, PeerId, PeerId o) { f.FailWrites(o, UnavailableError("link down")); },
       nullptr, StatusCode::kOk, StatusCode::kOk, "", true, true,
       &FaultCounters::batches_forwarded},
      {"fail then clear",
       [](FaultTransport& f, PeerId, PeerId) {
         f.FailWrites(FaultTransport::kAllPeers, InternalError("x"));
         f.FailWrites(FaultTransport::kAllPeers, Status::Ok());
       },
       nullptr, StatusCode::kOk, StatusCode::kOk, "", true, true,
       &FaultCounters::batches_forwarded},
      {"drop messages", [](FaultTransport& f, PeerId, PeerId) { f.DropMessages(true); }, nullptr,
       StatusCode::kOk, StatusCode::kOk, "", true, false, &FaultCounters::messages_dropped},
      {"delay", [](FaultTransport& f, PeerId, PeerId) { f.DelayWrites(Ms(30)); }, nullptr,
       StatusCode::kOk, StatusCode::kOk, "", true, true, &FaultCounters::batches_delayed},
      {"hold then release", [](FaultTransport& f, PeerId, PeerId) { f.HoldWrites(); },
       [](Harness& h) {
         EXPECT_EQ(h.f->HeldBatches(), 1u);
         h.Flush();
         EXPECT_TRUE(h.Untouched());
         EXPECT_TRUE(h.inbox.Got().empty());
         h.f->ReleaseHeldWrites();
       },
       StatusCode::kOk, StatusCode::kOk, "", true, true, &FaultCounters::batches_held},
      {"vanish", [](FaultTransport& f, PeerId p, PeerId) { f.VanishPeer(p); }, nullptr,
       StatusCode::kUnavailable, StatusCode::kOk, "", false, false, &FaultCounters::peers_vanished},
  };
}

// One fault: a write and a message posted after it is injected, checked
// against what the case says (codes, whether data and message arrived).
void CheckFault(const FaultCase& c) {
  SCOPED_TRACE(c.name);
  Harness h;
  c.inject(*h.f, h.peer, h.other);
  Completions done;
  const auto start = std::chrono::steady_clock::now();
  Status post = h.f->PostWrites(h.peer, {h.Op(0, 64)}, done.Callback());
  ASSERT_EQ(post.code(), c.post_code) << post.ToString();
  Status send = h.f->SendMessage(h.peer, "m");
  if (c.after_post) c.after_post(h);
  if (!post.ok()) {
    EXPECT_EQ(send.code(), c.post_code);
    EXPECT_THAT(post.message(), HasSubstr("peer " + std::to_string(h.peer)));
    auto calls = h.failures.Wait(1);
    EXPECT_EQ(calls[0].first, h.peer);
    EXPECT_EQ(calls[0].second, post);
    h.Flush();
    EXPECT_EQ(h.failures.Count(), 1u);
    EXPECT_EQ(done.Count(), 0u);
  } else {
    ASSERT_TRUE(send.ok()) << send.ToString();
    Status s = done.Wait(1)[0];
    EXPECT_EQ(s.code(), c.done_code) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr(c.done_message));
    EXPECT_NE(done.Thread(0), std::this_thread::get_id());
    if (std::string(c.name) == "delay") {
      EXPECT_GE(std::chrono::steady_clock::now() - start, Ms(30));
    }
    h.f->DropMessages(false);
    ASSERT_TRUE(h.f->SendMessage(h.peer, "end").ok());
    auto got = h.inbox.WaitFor("end");
    const bool delivered = got.size() == 2 && got[0].first == "m";
    EXPECT_EQ(delivered, c.delivered);
    if (delivered) {
      EXPECT_EQ(got[0].second, c.written) << "message overtook its write";
    }
    EXPECT_EQ(h.failures.Count(), 0u);
  }
  EXPECT_EQ(h.Written(), c.written);
  if (!c.written) {
    EXPECT_TRUE(h.Untouched());
  }
  EXPECT_EQ(h.f->counters().*c.counter, 1u);
}

TEST(FaultTransportTest, TableOfFaults) {
  for (const FaultCase& c : FaultCases()) CheckFault(c);
}

TEST(FaultTransportTest, NameWrapsInner) {
  Harness h;
  EXPECT_EQ(h.f->Name(), "fault(loopback)");
  EXPECT_EQ(h.f->Address(), h.f->inner().Address());
  EXPECT_EQ(h.f->PathTo(h.peer).value(), DataPath::kLoopback);
}

TEST(FaultTransportTest, HeldBatchBlocksLaterMessagesToItsPeerOnly) {
  Harness h;
  h.f->HoldWrites();
  Completions done;
  ASSERT_TRUE(h.f->PostWrites(h.peer, {h.Op(0, 64)}, done.Callback()).ok());
  ASSERT_TRUE(h.f->PostWrites(h.peer, {h.Op(64, 64)}, done.Callback()).ok());
  ASSERT_TRUE(h.f->SendMessage(h.peer, "after").ok());
  ASSERT_TRUE(h.f->SendMessage(h.other, "ping").ok());
  h.inbox2.WaitFor("ping");  // other peers flow
  h.Flush();
  EXPECT_EQ(h.f->HeldBatches(), 2u);
  EXPECT_EQ(done.Count(), 0u);
  EXPECT_TRUE(h.Untouched());
  EXPECT_TRUE(h.inbox.Got().empty());
  h.f->ReleaseHeldWrites();
  for (const Status& s : done.Wait(2)) EXPECT_TRUE(s.ok()) << s.ToString();
  auto got = h.inbox.WaitFor("after");
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got[0].second) << "message overtook the held write";
  EXPECT_EQ(h.f->HeldBatches(), 0u);
  EXPECT_EQ(h.f->counters().batches_held, 2u);
  EXPECT_EQ(h.f->counters().batches_forwarded, 2u);
}

TEST(FaultTransportTest, UrgentMessagesFlowWhileWritesAreHeld) {
  Harness h;
  h.f->HoldWrites();
  Completions done;
  ASSERT_TRUE(h.f->PostWrites(h.peer, {h.Op(0, 64)}, done.Callback()).ok());
  ASSERT_TRUE(h.f->SendMessage(h.peer, "ordered").ok());
  ASSERT_TRUE(h.f->SendUrgentMessage(h.peer, "beat").ok());
  auto got = h.inbox.WaitFor("beat");
  ASSERT_EQ(got.size(), 1u);  // "ordered" still waits behind the held batch
  EXPECT_FALSE(got[0].second);
  h.f->DropUrgentMessages(true);
  ASSERT_TRUE(h.f->SendUrgentMessage(h.peer, "lost beat").ok());
  h.f->ReleaseHeldWrites();
  got = h.inbox.WaitFor("ordered");
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(got[1].second);
  EXPECT_EQ(h.f->counters().urgent_forwarded, 1u);
  EXPECT_EQ(h.f->counters().urgent_dropped, 1u);
  h.f->VanishPeer(h.peer);
  EXPECT_EQ(h.f->SendUrgentMessage(h.peer, "x").code(), StatusCode::kUnavailable);
}

TEST(FaultTransportTest, MutedEndpointSwallowsMessagesAndANewOneDelivers) {
  Harness h;
  h.f->MuteNextConnects(1);
  const PeerId muted = h.f->Connect(h.decode->Address()).value();
  const PeerId fresh = h.f->Connect(h.decode->Address()).value();
  ASSERT_TRUE(h.f->SendMessage(muted, "hello 1").ok());
  ASSERT_TRUE(h.f->SendUrgentMessage(muted, "beat 1").ok());
  ASSERT_TRUE(h.f->SendMessage(fresh, "hello 2").ok());
  // Per-sender order on the loopback: "hello 2" arriving means nothing sent
  // before it on a working endpoint is still on its way.
  auto got = h.inbox.WaitFor("hello 2");
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].first, "hello 2");
  EXPECT_EQ(h.f->counters().muted_dropped, 2u);
  EXPECT_EQ(h.f->counters().messages_forwarded, 1u);
}

// A held message stays until released, while urgent messages on its
// endpoint flow; a message sent after the release waits behind it.
TEST(FaultTransportTest, HeldMessageComesOnReleaseAndKeepsItsPeersOrder) {
  Harness h;
  h.f->HoldMessages();
  ASSERT_TRUE(h.f->SendMessage(h.peer, "late").ok());
  ASSERT_TRUE(h.f->SendUrgentMessage(h.peer, "beat").ok());
  auto got = h.inbox.WaitFor("beat");
  EXPECT_EQ(got.size(), 1u);
  EXPECT_EQ(h.f->HeldMessages(), 1u);
  h.f->ReleaseHeldWrites();  // releases batches only
  EXPECT_EQ(h.f->HeldMessages(), 1u);
  h.f->ReleaseHeldMessages();
  ASSERT_TRUE(h.f->SendMessage(h.peer, "after").ok());
  got = h.inbox.WaitFor("after");
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[1].first, "late");
  EXPECT_EQ(got[2].first, "after");
  EXPECT_EQ(h.f->HeldMessages(), 0u);
  EXPECT_EQ(h.f->counters().messages_held, 1u);
}

TEST(FaultTransportTest, VanishFailsHeldBatchesOnceAndLaterCalls) {
  Harness h;
  h.f->HoldWrites();
  Completions done;
  ASSERT_TRUE(h.f->PostWrites(h.peer, {h.Op(0, 64)}, done.Callback()).ok());
  ASSERT_TRUE(h.f->PostWrites(h.peer, {h.Op(64, 64)}, done.Callback()).ok());
  h.f->VanishPeer(h.peer);
  h.f->VanishPeer(h.peer);  // no second report
  auto calls = h.failures.Wait(1);
  EXPECT_EQ(calls[0].first, h.peer);
  EXPECT_EQ(calls[0].second.code(), StatusCode::kUnavailable);
  EXPECT_THAT(calls[0].second.message(), HasSubstr("peer " + std::to_string(h.peer)));
  for (const Status& s : done.Wait(2)) EXPECT_EQ(s, calls[0].second);
  h.f->ReleaseHeldWrites();
  h.Flush();
  EXPECT_EQ(h.failures.Count(), 1u);
  EXPECT_EQ(done.Count(), 2u);
  EXPECT_TRUE(h.Untouched());
  EXPECT_EQ(h.f->PostWrites(h.peer, {h.Op(0, 8)}, done.Callback()).code(),
            StatusCode::kUnavailable);
  EXPECT_EQ(h.f->SendMessage(h.peer, "x").code(), StatusCode::kUnavailable);
  EXPECT_EQ(h.f->ImportRegion(h.peer, "k").status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(h.f->counters().batches_vanished, 2u);
  // Other peers are unaffected.
  Completions ok;
  ASSERT_TRUE(h.f->PostWrites(h.other, {{h.local, 0, h.remote2, 0, 8}}, ok.Callback()).ok());
  EXPECT_TRUE(ok.Wait(1)[0].ok());
}

TEST(FaultTransportTest, VanishFailsBatchesAlreadyInTheInnerTransport) {
  Harness h;
  // Block the inner worker inside a completion so the next batch is pending
  // in the inner transport when the peer vanishes.
  Gate gate;
  Gate blocked;
  ASSERT_TRUE(h.f->PostWrites(h.peer, {},
                              [&](const Status&) {
                                blocked.Open();
                                gate.Wait();
                              })
                  .ok());
  blocked.Wait();
  Completions done;
  ASSERT_TRUE(h.f->PostWrites(h.peer, {h.Op(0, 64)}, done.Callback()).ok());
  h.f->VanishPeer(h.peer);
  gate.Open();
  Status s = done.Wait(1)[0];
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("vanished"));
  EXPECT_EQ(h.failures.Wait(1).size(), 1u);
}

TEST(FaultTransportTest, InnerPeerFailureIsReportedOnceAndFailsQueuedBatches) {
  Harness h;
  h.f->HoldWrites();
  Completions done;
  ASSERT_TRUE(h.f->PostWrites(h.peer, {h.Op(0, 64)}, done.Callback()).ok());
  h.decode.reset();  // the real peer dies
  auto calls = h.failures.Wait(1);
  EXPECT_EQ(calls[0].first, h.peer);
  EXPECT_EQ(calls[0].second.code(), StatusCode::kUnavailable);
  EXPECT_THAT(calls[0].second.message(), HasSubstr("decode"));
  EXPECT_EQ(done.Wait(1)[0], calls[0].second);
  h.f->VanishPeer(h.peer);  // already dead: no second report
  h.Flush();
  EXPECT_EQ(h.failures.Count(), 1u);
  EXPECT_EQ(h.f->PostWrites(h.peer, {h.Op(0, 8)}, done.Callback()).code(),
            StatusCode::kUnavailable);
  EXPECT_TRUE(h.Untouched());
}

TEST(FaultTransportTest, DisconnectAbortsHeldBatches) {
  Harness h;
  h.f->HoldWrites();
  Completions done;
  ASSERT_TRUE(h.f->PostWrites(h.peer, {h.Op(0, 64)}, done.Callback()).ok());
  h.f->Disconnect(h.peer);
  Status s = done.Wait(1)[0];
  EXPECT_EQ(s.code(), StatusCode::kAborted) << s.ToString();
  EXPECT_EQ(h.f->PostWrites(h.peer, {h.Op(0, 8)}, done.Callback()).code(), StatusCode::kNotFound);
  h.f->ReleaseHeldWrites();
  h.Flush();
  EXPECT_EQ(done.Count(), 1u);
  EXPECT_TRUE(h.Untouched());
  EXPECT_EQ(h.failures.Count(), 0u);
}

TEST(FaultTransportTest, DestroyAbortsHeldBatches) {
  Harness h;
  h.f->HoldWrites();
  Completions done;
  ASSERT_TRUE(h.f->PostWrites(h.peer, {h.Op(0, 64)}, done.Callback()).ok());
  h.f.reset();
  Status s = done.Wait(1)[0];
  EXPECT_EQ(s.code(), StatusCode::kAborted) << s.ToString();
  EXPECT_TRUE(h.Untouched());
}

TEST(FaultTransportTest, InvalidOpsAreRejectedUnderEveryFault) {
  const std::function<void(FaultTransport&)> modes[] = {
      [](FaultTransport&) {},
      [](FaultTransport& f) { f.HoldWrites(); },
      [](FaultTransport& f) { f.DelayWrites(Ms(1)); },
      [](FaultTransport& f) { f.FailWrites(FaultTransport::kAllPeers, DataLossError("x")); },
  };
  for (size_t m = 0; m < std::size(modes); ++m) {
    SCOPED_TRACE("mode " + std::to_string(m));
    Harness h;
    modes[m](*h.f);
    Completions done;
    WriteOp unknown_local = h.Op(0, 8);
    unknown_local.local_region = 77;
    WriteOp past_local = h.Op(Harness::kSize - 4, 8);
    WriteOp foreign_remote = {h.local, 0, h.remote2, 0, 8};  // imported on `other`
    for (const WriteOp& bad : {unknown_local, past_local, foreign_remote}) {
      Status st = h.f->PostWrites(h.peer, {h.Op(0, 8), bad}, done.Callback());
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
      EXPECT_THAT(st.message(), HasSubstr("op 1"));
    }
    EXPECT_EQ(h.f->PostWrites(h.peer, {h.Op(0, 8)}, nullptr).code(), StatusCode::kInvalidArgument);
    h.f->ReleaseHeldWrites();
    h.Flush();
    EXPECT_EQ(done.Count(), 0u);
    EXPECT_TRUE(h.Untouched());
  }
}

TEST(FaultTransportTest, RemoteRangeErrorOfAHeldBatchCompletesWithInvalidArgument) {
  Harness h;
  Completions done;
  WriteOp past_remote = h.Op(0, 8);
  past_remote.remote_offset = Harness::kSize;
  // Straight through: the inner transport rejects it synchronously.
  EXPECT_EQ(h.f->PostWrites(h.peer, {past_remote}, done.Callback()).code(),
            StatusCode::kInvalidArgument);
  // Held: only the inner transport knows the remote size; it answers later.
  h.f->HoldWrites();
  ASSERT_TRUE(h.f->PostWrites(h.peer, {past_remote}, done.Callback()).ok());
  h.f->ReleaseHeldWrites();
  Status s = done.Wait(1)[0];
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_TRUE(h.Untouched());
}

}  // namespace
}  // namespace kvbridge::internal
