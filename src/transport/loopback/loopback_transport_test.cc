#include "transport/loopback/loopback_transport.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "transport/test_util.h"

namespace kvbridge::internal {
namespace {

using ::kvbridge::internal::testing::Completions;
constexpr auto kMediated = Transport::GrantReach::kMediated;
using ::kvbridge::internal::testing::Failures;
using ::kvbridge::internal::testing::Gate;
using ::testing::HasSubstr;

std::unique_ptr<Transport> MustCreate(const std::shared_ptr<LoopbackFabric>& fabric,
                                      const std::string& name) {
  auto t = CreateLoopbackTransport(fabric, name);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

// Sender `a` connected to target `b`; each has a 4 KiB buffer registered.
class LoopbackTest : public ::testing::Test {
 protected:
  static constexpr size_t kSize = 4096;

  void SetUp() override {
    fabric_ = std::make_shared<LoopbackFabric>();
    a_ = MustCreate(fabric_, "prefill");
    b_ = MustCreate(fabric_, "decode");
    ASSERT_TRUE(a_ && b_);
    a_->SetPeerFailureHandler(failures_.Handler());
    for (size_t i = 0; i < kSize; ++i) src_[i] = static_cast<uint8_t>(i * 7 + 1);
    auto la = a_->RegisterMemory(src_.data(), kSize, MemoryKind::kDram);
    auto lb = b_->RegisterMemory(dst_.data(), kSize, MemoryKind::kDram);
    ASSERT_TRUE(la.ok() && lb.ok());
    local_ = la->id;
    target_region_ = lb->id;
    remote_key_ = lb->remote_key;
    auto peer = a_->Connect(b_->Address());
    ASSERT_TRUE(peer.ok()) << peer.status().ToString();
    peer_ = *peer;
    auto rr = a_->ImportRegion(peer_, remote_key_);
    ASSERT_TRUE(rr.ok()) << rr.status().ToString();
    remote_ = *rr;
  }

  WriteOp Op(uint64_t local_off, uint64_t remote_off, uint64_t len) const {
    return {local_, local_off, remote_, remote_off, len};
  }

  // Blocks a_'s worker inside a callback until the returned gate opens, so
  // batches posted afterwards are still pending.
  std::unique_ptr<Gate> BlockSenderWorker() {
    auto gate = std::make_unique<Gate>();
    Gate* g = gate.get();
    auto started = std::make_shared<Gate>();
    EXPECT_TRUE(a_->PostWrites(peer_, {}, [g, started](const Status&) {
                    started->Open();
                    g->Wait();
                  }).ok());
    started->Wait();
    return gate;
  }

  bool DstUntouched() const {
    for (uint8_t v : dst_)
      if (v != 0) return false;
    return true;
  }

  // Declared before the transports: their callbacks use these until the
  // transports are destroyed.
  Failures failures_;
  std::vector<uint8_t> src_ = std::vector<uint8_t>(kSize);
  std::vector<uint8_t> dst_ = std::vector<uint8_t>(kSize, 0);
  std::shared_ptr<LoopbackFabric> fabric_;
  std::unique_ptr<Transport> a_;
  std::unique_ptr<Transport> b_;
  RegionId local_ = 0;
  RegionId target_region_ = 0;
  std::string remote_key_;
  PeerId peer_ = 0;
  RemoteRegionId remote_ = 0;
};

TEST(LoopbackCreateTest, ValidatesArgumentsAndNames) {
  auto fabric = std::make_shared<LoopbackFabric>();
  EXPECT_EQ(CreateLoopbackTransport(nullptr, "x").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateLoopbackTransport(fabric, "").status().code(), StatusCode::kInvalidArgument);
  auto first = MustCreate(fabric, "decode");
  EXPECT_EQ(first->Name(), "loopback");
  auto dup = CreateLoopbackTransport(fabric, "decode");
  EXPECT_EQ(dup.status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(fabric->Size(), 1u);
  const std::string old_address = first->Address();
  first.reset();
  EXPECT_EQ(fabric->Size(), 0u);
  auto second = MustCreate(fabric, "decode");  // the name is free again
  EXPECT_NE(second->Address(), old_address);   // but it is a new incarnation
}

TEST_F(LoopbackTest, RegisterAndDeregisterValidate) {
  EXPECT_EQ(a_->RegisterMemory(nullptr, 8, MemoryKind::kDram).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->RegisterMemory(src_.data(), 0, MemoryKind::kDram).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->DeregisterMemory(9999).code(), StatusCode::kNotFound);
  EXPECT_TRUE(a_->DeregisterMemory(local_).ok());
  EXPECT_EQ(a_->DeregisterMemory(local_).code(), StatusCode::kNotFound);
}

TEST_F(LoopbackTest, WritesLandAndCompleteOnTransportThread) {
  Completions done;
  ASSERT_TRUE(
      a_->PostWrites(peer_, {Op(0, 100, 10), Op(1000, 2000, 96), Op(4090, 0, 6)}, done.Callback())
          .ok());
  auto statuses = done.Wait(1);
  ASSERT_EQ(statuses.size(), 1u);
  EXPECT_TRUE(statuses[0].ok()) << statuses[0].ToString();
  EXPECT_NE(done.Thread(0), std::this_thread::get_id());
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(dst_[100 + i], src_[i]);
  for (size_t i = 0; i < 96; ++i) EXPECT_EQ(dst_[2000 + i], src_[1000 + i]);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(dst_[i], src_[4090 + i]);
  EXPECT_EQ(dst_[99], 0);
  EXPECT_EQ(dst_[110], 0);
  EXPECT_EQ(dst_[2096], 0);
  EXPECT_EQ(a_->PathTo(peer_).value(), DataPath::kLoopback);
  EXPECT_EQ(a_->PathTo(777).status().code(), StatusCode::kNotFound);
}

struct BadOpCase {
  const char* name;
  WriteOp (*make)(const WriteOp& good, RemoteRegionId other_peer_region);
  const char* expect;
};

TEST_F(LoopbackTest, InvalidBatchesAreRejectedWithoutWritingOrCallback) {
  // A region imported on a second connection to the same target: valid
  // there, foreign on peer_.
  auto peer2 = a_->Connect(b_->Address());
  ASSERT_TRUE(peer2.ok());
  ASSERT_NE(*peer2, peer_);
  auto other = a_->ImportRegion(*peer2, remote_key_);
  ASSERT_TRUE(other.ok());
  ASSERT_NE(*other, remote_);

  const BadOpCase cases[] = {
      {"unknown local region",
       [](const WriteOp& g, RemoteRegionId) {
         auto o = g;
         o.local_region = 99;
         return o;
       },
       "unknown local region 99"},
      {"local range past end",
       [](const WriteOp& g, RemoteRegionId) {
         auto o = g;
         o.local_offset = kSize - 4;
         return o;
       },
       "local range"},
      {"local offset overflow",
       [](const WriteOp& g, RemoteRegionId) {
         auto o = g;
         o.local_offset = UINT64_MAX - 2;
         return o;
       },
       "local range"},
      {"unknown remote region",
       [](const WriteOp& g, RemoteRegionId) {
         auto o = g;
         o.remote_region = 99;
         return o;
       },
       "remote region 99 was not imported"},
      {"region of another peer",
       [](const WriteOp& g, RemoteRegionId r) {
         auto o = g;
         o.remote_region = r;
         return o;
       },
       "was not imported on this peer"},
      {"remote range past end",
       [](const WriteOp& g, RemoteRegionId) {
         auto o = g;
         o.remote_offset = kSize;
         return o;
       },
       "remote range"},
      {"remote length overflow",
       [](const WriteOp& g, RemoteRegionId) {
         auto o = g;
         o.length = UINT64_MAX;
         return o;
       },
       "range"},
  };
  Completions done;
  for (const BadOpCase& c : cases) {
    SCOPED_TRACE(c.name);
    WriteOp good = Op(0, 0, 8);
    Status st = a_->PostWrites(peer_, {good, c.make(good, *other)}, done.Callback());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_THAT(st.message(), HasSubstr("op 1"));
    EXPECT_THAT(st.message(), HasSubstr(c.expect));
  }
  EXPECT_EQ(a_->PostWrites(peer_, {Op(0, 0, 8)}, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->PostWrites(12345, {Op(0, 0, 8)}, done.Callback()).code(), StatusCode::kNotFound);
  // Flush: a later batch completes, so rejected ones had their chance to run.
  Completions flush;
  ASSERT_TRUE(a_->PostWrites(peer_, {}, flush.Callback()).ok());
  EXPECT_TRUE(flush.Wait(1)[0].ok());
  EXPECT_EQ(done.Count(), 0u);
  EXPECT_TRUE(DstUntouched());
}

TEST_F(LoopbackTest, ConnectRejectsGarbledForeignAndStaleAddresses) {
  const std::string addr = b_->Address();
  for (size_t i = 0; i < addr.size(); ++i) {
    std::string bad = addr;
    bad[i] ^= 0x01;
    EXPECT_EQ(a_->Connect(bad).status().code(), StatusCode::kInvalidArgument) << "byte " << i;
  }
  EXPECT_EQ(a_->Connect("").status().code(), StatusCode::kInvalidArgument);

  auto other_fabric = std::make_shared<LoopbackFabric>();
  auto stranger = MustCreate(other_fabric, "decode");
  auto foreign = a_->Connect(stranger->Address());
  EXPECT_EQ(foreign.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(foreign.status().message(), HasSubstr("another fabric"));

  // "decode" restarts: the old blob must not reach the new incarnation.
  b_.reset();
  auto b2 = MustCreate(fabric_, "decode");
  auto stale = a_->Connect(addr);
  EXPECT_EQ(stale.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(stale.status().message(), HasSubstr("decode"));
  auto fresh = a_->Connect(b2->Address());
  ASSERT_TRUE(fresh.ok());
  EXPECT_NE(*fresh, peer_);
  // The stale PeerId stays dead even though a "decode" is alive again.
  failures_.Wait(1);
  EXPECT_EQ(a_->SendMessage(peer_, "x").code(), StatusCode::kUnavailable);
}

TEST_F(LoopbackTest, ImportRegionValidatesKeys) {
  EXPECT_EQ(a_->ImportRegion(999, remote_key_).status().code(), StatusCode::kNotFound);
  for (size_t i = 0; i < remote_key_.size(); ++i) {
    std::string bad = remote_key_;
    bad[i] ^= 0x40;
    EXPECT_EQ(a_->ImportRegion(peer_, bad).status().code(), StatusCode::kInvalidArgument) << i;
  }
  // A key of the sender's own region is foreign on a connection to decode.
  auto own = a_->RegisterMemory(src_.data(), 16, MemoryKind::kDram);
  ASSERT_TRUE(own.ok());
  auto foreign = a_->ImportRegion(peer_, own->remote_key);
  EXPECT_EQ(foreign.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(foreign.status().message(), HasSubstr("foreign"));
  // Importing the same key again returns the cached id.
  EXPECT_EQ(a_->ImportRegion(peer_, remote_key_).value(), remote_);
  // A deregistered region cannot be imported.
  auto gone = b_->RegisterMemory(dst_.data(), 64, MemoryKind::kDram);
  ASSERT_TRUE(gone.ok());
  ASSERT_TRUE(b_->DeregisterMemory(gone->id).ok());
  EXPECT_EQ(a_->ImportRegion(peer_, gone->remote_key).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(LoopbackTest, MessagesArriveInOrderAfterEarlierWrites) {
  // Each message i follows a write of byte value i into dst_[i]; the handler
  // (on decode's thread) checks that the byte is already there.
  constexpr int kCount = 200;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> got;
  std::vector<std::string> errors;
  std::thread::id handler_thread;
  b_->SetMessageHandler([&](std::string_view payload) {
    std::lock_guard<std::mutex> lock(mu);
    const int i = std::stoi(std::string(payload));
    if (dst_[i] != src_[i]) errors.push_back("message " + std::to_string(i) + " before its write");
    handler_thread = std::this_thread::get_id();
    got.emplace_back(payload);
    cv.notify_all();
  });
  Completions done;
  for (int i = 0; i < kCount; ++i) {
    ASSERT_TRUE(a_->PostWrites(peer_, {Op(i, i, 1)}, done.Callback()).ok());
    ASSERT_TRUE(a_->SendMessage(peer_, std::to_string(i)).ok());
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return got.size() == kCount; });
    for (int i = 0; i < kCount; ++i) EXPECT_EQ(got[i], std::to_string(i));
    EXPECT_TRUE(errors.empty()) << errors.front();
    EXPECT_NE(handler_thread, std::this_thread::get_id());
  }
  done.Wait(kCount);
  EXPECT_NE(handler_thread, done.Thread(0));  // target's thread, not the sender's
  EXPECT_EQ(a_->SendMessage(4242, "x").code(), StatusCode::kNotFound);
}

TEST_F(LoopbackTest, UrgentMessageOvertakesPendingBatches) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> got;
  b_->SetMessageHandler([&](std::string_view payload) {
    std::lock_guard<std::mutex> lock(mu);
    got.emplace_back(payload);
    cv.notify_all();
  });
  auto gate = BlockSenderWorker();  // the batch and the ordered message wait
  Completions done;
  ASSERT_TRUE(a_->PostWrites(peer_, {Op(0, 0, 64)}, done.Callback()).ok());
  ASSERT_TRUE(a_->SendMessage(peer_, "ordered").ok());
  ASSERT_TRUE(a_->SendUrgentMessage(peer_, "beat").ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return !got.empty(); });
    EXPECT_EQ(got, std::vector<std::string>{"beat"});
  }
  EXPECT_EQ(done.Count(), 0u);
  gate->Open();
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return got.size() == 2; });
    EXPECT_EQ(got[1], "ordered");
  }
  EXPECT_EQ(a_->SendUrgentMessage(999, "x").code(), StatusCode::kNotFound);
  b_.reset();
  EXPECT_EQ(a_->SendUrgentMessage(peer_, "x").code(), StatusCode::kUnavailable);
}

TEST_F(LoopbackTest, DestroyedPeerFailsPendingBatchesAndLaterCalls) {
  auto second = a_->Connect(b_->Address());  // a second PeerId to the same target
  ASSERT_TRUE(second.ok());
  auto gate = BlockSenderWorker();
  Completions pending;
  ASSERT_TRUE(a_->PostWrites(peer_, {Op(0, 0, 64)}, pending.Callback()).ok());
  ASSERT_TRUE(a_->PostWrites(peer_, {Op(64, 64, 64)}, pending.Callback()).ok());
  ASSERT_TRUE(a_->SendMessage(peer_, "lost").ok());
  b_.reset();  // decode dies with two batches pending towards it
  gate->Open();

  auto statuses = pending.Wait(2);
  auto calls = failures_.Wait(2);
  ASSERT_EQ(calls.size(), 2u);
  std::set<PeerId> failed_peers;
  for (auto& [peer, why] : calls) {
    failed_peers.insert(peer);
    EXPECT_EQ(why.code(), StatusCode::kUnavailable);
    EXPECT_THAT(why.message(), HasSubstr("peer " + std::to_string(peer)));
    EXPECT_THAT(why.message(), HasSubstr("decode"));
  }
  EXPECT_EQ(failed_peers, (std::set<PeerId>{peer_, *second}));
  const Status& peer_status = calls[0].first == peer_ ? calls[0].second : calls[1].second;
  for (const Status& s : statuses) EXPECT_EQ(s, peer_status);  // the same Status
  EXPECT_TRUE(DstUntouched());

  EXPECT_EQ(a_->PostWrites(peer_, {Op(0, 0, 8)}, pending.Callback()).code(),
            StatusCode::kUnavailable);
  EXPECT_EQ(a_->SendMessage(peer_, "x").code(), StatusCode::kUnavailable);
  EXPECT_EQ(a_->ImportRegion(peer_, remote_key_).status().code(), StatusCode::kUnavailable);
  Completions flush;
  auto self = a_->Connect(a_->Address());
  ASSERT_TRUE(self.ok());
  ASSERT_TRUE(a_->PostWrites(*self, {}, flush.Callback()).ok());
  flush.Wait(1);
  EXPECT_EQ(failures_.Count(), 2u);  // once per PeerId, never again
  EXPECT_EQ(pending.Count(), 2u);
}

TEST_F(LoopbackTest, DisconnectAbortsPendingBatches) {
  auto gate = BlockSenderWorker();
  Completions pending;
  ASSERT_TRUE(a_->PostWrites(peer_, {Op(0, 0, 64)}, pending.Callback()).ok());
  ASSERT_TRUE(a_->PostWrites(peer_, {Op(0, 64, 64)}, pending.Callback()).ok());
  a_->Disconnect(peer_);
  gate->Open();
  for (const Status& s : pending.Wait(2)) {
    EXPECT_EQ(s.code(), StatusCode::kAborted) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("disconnected"));
  }
  EXPECT_TRUE(DstUntouched());
  EXPECT_EQ(a_->PostWrites(peer_, {Op(0, 0, 8)}, pending.Callback()).code(), StatusCode::kNotFound);
  EXPECT_EQ(a_->SendMessage(peer_, "x").code(), StatusCode::kNotFound);
  EXPECT_EQ(failures_.Count(), 0u);
}

TEST_F(LoopbackTest, TargetDeregisteredBeforeBatchRunsFailsWithoutWriting) {
  auto gate = BlockSenderWorker();
  Completions pending;
  ASSERT_TRUE(a_->PostWrites(peer_, {Op(0, 0, 64)}, pending.Callback()).ok());
  ASSERT_TRUE(b_->DeregisterMemory(target_region_).ok());
  gate->Open();
  auto s = pending.Wait(1)[0];
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("deregistered"));
  EXPECT_TRUE(DstUntouched());
}

TEST_F(LoopbackTest, DestroyingSenderAbortsItsPendingBatches) {
  auto gate = BlockSenderWorker();
  Completions pending;
  ASSERT_TRUE(a_->PostWrites(peer_, {Op(0, 0, 64)}, pending.Callback()).ok());
  std::thread destroyer([&] { a_.reset(); });
  // The destructor leaves the fabric before it waits for the worker.
  while (fabric_->Size() != 1) std::this_thread::yield();
  gate->Open();
  destroyer.join();
  auto s = pending.Wait(1)[0];
  EXPECT_EQ(s.code(), StatusCode::kAborted) << s.ToString();
  EXPECT_TRUE(DstUntouched());
}

// The fence for a peer that may still be writing: a batch queued before the
// grant was revoked, run after, writes nothing; other capabilities still do.
TEST_F(LoopbackTest, RevokedGrantRefusesQueuedWritesOthersStillWrite) {
  auto g1 = b_->GrantRegion(target_region_, 1, kMediated);
  auto g2 = b_->GrantRegion(target_region_, 2, kMediated);
  ASSERT_TRUE(g1.ok() && g2.ok()) << g1.status().ToString();
  EXPECT_NE(*g1, *g2);
  EXPECT_NE(*g1, remote_key_);
  auto r1 = a_->ImportRegion(peer_, *g1);
  auto r2 = a_->ImportRegion(peer_, *g2);
  ASSERT_TRUE(r1.ok() && r2.ok()) << r1.status().ToString();
  EXPECT_NE(*r1, *r2);
  {
    Completions done;
    ASSERT_TRUE(a_->PostWrites(peer_, {{local_, 0, *r1, 0, 64}}, done.Callback()).ok());
    ASSERT_TRUE(done.Wait(1)[0].ok());
    EXPECT_EQ(dst_[10], src_[10]);
    std::fill(dst_.begin(), dst_.end(), 0);
  }
  // Queued behind a blocked worker, like writes held in a partitioned link.
  auto gate = BlockSenderWorker();
  Completions late;
  ASSERT_TRUE(a_->PostWrites(peer_, {{local_, 0, *r1, 0, kSize}}, late.Callback()).ok());
  ASSERT_TRUE(b_->RevokeGrant(1).ok());
  gate->Open();
  Status st = late.Wait(1)[0];
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("revoked"));
  EXPECT_TRUE(DstUntouched()) << "a write under the revoked grant landed";
  // The revoked key cannot be imported again; grant 2 and the region's own
  // key still write.
  EXPECT_EQ(a_->ImportRegion(peer_, *g1).status().code(), StatusCode::kPermissionDenied);
  Completions others;
  ASSERT_TRUE(a_->PostWrites(peer_, {{local_, 0, *r2, 0, 8}}, others.Callback()).ok());
  ASSERT_TRUE(a_->PostWrites(peer_, {Op(8, 8, 8)}, others.Callback()).ok());
  for (const Status& s : others.Wait(2)) EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(dst_[0], src_[0]);
  EXPECT_EQ(dst_[15], src_[15]);
  // A repeated revoke is OK (nothing landing); unknown grants and bad ids
  // are named.
  EXPECT_TRUE(b_->RevokeGrant(1).ok());
  EXPECT_EQ(b_->RevokeGrant(99).code(), StatusCode::kNotFound);
  EXPECT_EQ(b_->RevokeGrant(0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b_->GrantRegion(target_region_, 0, kMediated).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(b_->GrantRegion(target_region_ + 100, 3, kMediated).status().code(),
            StatusCode::kNotFound);
}

TEST_F(LoopbackTest, ConnectToSelfWorks) {
  auto self = a_->Connect(a_->Address());
  ASSERT_TRUE(self.ok());
  auto mine = a_->RegisterMemory(dst_.data(), kSize, MemoryKind::kDram);
  ASSERT_TRUE(mine.ok());
  auto rr = a_->ImportRegion(*self, mine->remote_key);
  ASSERT_TRUE(rr.ok()) << rr.status().ToString();
  Completions done;
  ASSERT_TRUE(a_->PostWrites(*self, {{local_, 8, *rr, 16, 8}}, done.Callback()).ok());
  EXPECT_TRUE(done.Wait(1)[0].ok());
  EXPECT_EQ(dst_[16], src_[8]);
  EXPECT_EQ(dst_[23], src_[15]);
}

}  // namespace
}  // namespace kvbridge::internal
