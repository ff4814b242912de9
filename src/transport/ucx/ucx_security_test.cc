// Write capabilities on the UCX transport (two transports in this process):
// a data message without its region's token writes nothing, a forged region
// descriptor is refused, and a flood of half-sent batches cannot grow the
// target's state.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "kvbridge/memory.h"
#include "transport/test_util.h"
#include "transport/ucx/raw_sender_test_util.h"
#include "transport/ucx/ucx_test_util.h"
#include "transport/ucx/ucx_transport_impl.h"

namespace kvbridge::internal::ucx {
namespace {

using testing::Completions;
using ::testing::HasSubstr;

constexpr size_t kRegion = 4 << 20;

using testing::MakeUcxForTest;
using testing::TcpTestOptions;
constexpr auto kMediated = Transport::GrantReach::kMediated;

// Also a barrier with the target's progress thread (see Stats).
IncomingStats StatsOf(Transport& t) { return static_cast<UcxTransport&>(t).Stats(); }

bool AllZero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != 0) return false;
  return true;
}

std::string Reencode(const std::string& key, void (*mutate)(RemoteKeyBlob&)) {
  auto blob = DecodeRemoteKey(key);
  EXPECT_TRUE(blob.ok());
  mutate(*blob);
  return EncodeRemoteKey(*blob);
}

// A writer and a target, connected, with a source and a destination region.
class UcxSecurityTest : public ::testing::Test {
 protected:
  void Build(bool same_host, size_t max_open = 4096,
             std::chrono::milliseconds revoke_timeout = std::chrono::milliseconds(5000),
             bool writer_put = false) {
    auto to = TcpTestOptions("target", same_host);
    to.max_incoming_batches_per_peer = max_open;
    to.revoke_timeout = revoke_timeout;
    target_ = MakeUcxForTest(to);
    auto wo = TcpTestOptions("writer", same_host);
    wo.force_put = writer_put;
    writer_ = MakeUcxForTest(wo);
    ASSERT_TRUE(target_ && writer_);
    src_.resize(kRegion);
    for (size_t i = 0; i < kRegion; ++i) src_[i] = static_cast<uint8_t>(i * 7 + 1);
    dst_.assign(kRegion, 0);
    auto s = writer_->RegisterMemory(src_.data(), kRegion, MemoryKind::kDram);
    auto d = target_->RegisterMemory(dst_.data(), kRegion, MemoryKind::kDram);
    ASSERT_TRUE(s.ok() && d.ok());
    src_id_ = s->id;
    dst_id_ = d->id;
    dst_key_ = d->remote_key;
    auto peer = writer_->Connect(target_->Address());
    ASSERT_TRUE(peer.ok()) << peer.status().ToString();
    peer_ = *peer;
  }

  // Writes `length` bytes at `offset` through the import of `key`; returns
  // the batch's Status (the target's ACK is the barrier).
  Status Write(const std::string& key, uint64_t offset, uint64_t length) {
    auto remote = writer_->ImportRegion(peer_, key);
    if (!remote.ok()) return remote.status();
    Completions done;
    Status posted = writer_->PostWrites(peer_, {WriteOp{src_id_, offset, *remote, offset, length}},
                                        done.Callback());
    if (!posted.ok()) return posted;
    return done.Wait(1)[0];
  }

  std::unique_ptr<Transport> target_, writer_;
  std::vector<uint8_t> src_, dst_;
  RegionId src_id_ = 0, dst_id_ = 0;
  std::string dst_key_;
  PeerId peer_ = 0;
};

TEST_F(UcxSecurityTest, WrongOrMissingTokenWritesNothingEagerOrRendezvous) {
  Build(/*same_host=*/false);
  const std::string wrong = Reencode(dst_key_, [](RemoteKeyBlob& b) { b.token.bytes[0] ^= 1; });
  const std::string zero = Reencode(dst_key_, [](RemoteKeyBlob& b) { b.token = RegionToken{}; });
  uint64_t rejected = 0;
  for (const std::string* key : {&wrong, &zero}) {
    for (uint64_t length : {uint64_t{4096}, uint64_t{1} << 20}) {  // eager, rendezvous
      Status st = Write(*key, 0, length);
      EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.ToString();
      EXPECT_THAT(st.message(), HasSubstr("no valid token"));
      // The refusing ACK, then Stats (run on the target's progress thread):
      // whatever the target did with the message is visible by now.
      EXPECT_EQ(StatsOf(*target_).rejected_token, ++rejected);
      EXPECT_TRUE(AllZero(dst_.data(), kRegion)) << "forged write of " << length << " landed";
    }
  }
  // The genuine descriptor still writes, at both sizes. Stats first: our
  // reads above happen before the target's progress thread writes (the
  // bytes travel through the kernel, which ThreadSanitizer cannot see).
  StatsOf(*target_);
  ASSERT_TRUE(Write(dst_key_, 0, 4096).ok());
  ASSERT_TRUE(Write(dst_key_, 1 << 20, 1 << 20).ok());
  IncomingStats stats = StatsOf(*target_);
  EXPECT_EQ(stats.rejected_token, rejected);
  EXPECT_EQ(stats.open_batches, 0u);
  EXPECT_EQ(std::memcmp(dst_.data(), src_.data(), 4096), 0);
  EXPECT_EQ(std::memcmp(dst_.data() + (1 << 20), src_.data() + (1 << 20), 1 << 20), 0);
}

TEST_F(UcxSecurityTest, ForgedSameHostDescriptorIsRefused) {
  Build(/*same_host=*/true);
  // Genuine: the owner grants its memory over its socket (cross-memory
  // attach here: the region is heap memory).
  ASSERT_TRUE(Write(dst_key_, 0, 4096).ok());
  EXPECT_EQ(*writer_->PathTo(peer_), DataPath::kCrossMemoryAttach);
  // Another pid (address blob and descriptor forged alike, so the blob is
  // not simply "foreign"): the kernel says the socket is the target's.
  auto addr = DecodeAddress(target_->Address());
  ASSERT_TRUE(addr.ok());
  addr->host.pid = getpid() + 1;
  auto forged_peer = writer_->Connect(EncodeAddress(*addr));
  ASSERT_TRUE(forged_peer.ok());
  const std::string other_pid =
      Reencode(dst_key_, [](RemoteKeyBlob& b) { b.owner.pid = getpid() + 1; });
  auto refused = writer_->ImportRegion(*forged_peer, other_pid);
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied) << refused.status().ToString();
  EXPECT_THAT(refused.status().message(), HasSubstr("not by the declared owner pid"));
  // Another address inside the writer's reach: the owner's table disagrees.
  const std::string other_base = Reencode(dst_key_, [](RemoteKeyBlob& b) { b.base += 4096; });
  auto moved = writer_->ImportRegion(peer_, other_base);
  EXPECT_EQ(moved.status().code(), StatusCode::kInvalidArgument) << moved.status().ToString();
  // Another socket name: none there, so UCX, where the token still rules.
  const std::string nowhere =
      Reencode(dst_key_, [](RemoteKeyBlob& b) { b.same_host_socket = "kvbridge-nowhere"; });
  auto fallback = writer_->ImportRegion(peer_, nowhere);
  ASSERT_TRUE(fallback.ok()) << fallback.status().ToString();
  EXPECT_EQ(*writer_->PathTo(peer_), DataPath::kUcxRendezvous);
  writer_->Disconnect(*forged_peer);
}

TEST_F(UcxSecurityTest, SharedSegmentIsTheOwnersMemfd) {
  Build(/*same_host=*/true);
  auto shared = AllocateSharedBuffer(1 << 20);
  ASSERT_TRUE(shared.ok());
  auto* mem = static_cast<uint8_t*>(*shared);
  std::memset(mem, 0, 1 << 20);
  auto reg = target_->RegisterMemory(mem, 1 << 20, MemoryKind::kDram);
  ASSERT_TRUE(reg.ok());
  ASSERT_TRUE(Write(reg->remote_key, 0, 8192).ok());
  EXPECT_EQ(*writer_->PathTo(peer_), DataPath::kSharedMemory);
  EXPECT_EQ(std::memcmp(mem, src_.data(), 8192), 0);
  // The token of another region does not open this one's segment.
  const std::string borrowed =
      Reencode(reg->remote_key, [](RemoteKeyBlob& b) { b.token.bytes[3] ^= 0x80; });
  auto refused = writer_->ImportRegion(peer_, borrowed);
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied) << refused.status().ToString();
  ASSERT_TRUE(target_->DeregisterMemory(reg->id).ok());
  ASSERT_TRUE(FreeSharedBuffer(mem).ok());
}

DataHeader HeaderFor(const std::string& key, uint64_t offset, uint64_t length, uint64_t batch,
                     uint64_t blocks) {
  auto blob = DecodeRemoteKey(key);
  EXPECT_TRUE(blob.ok());
  return DataHeader{blob->region_id, offset, length, /*connection=*/77, batch, blocks, blob->token};
}

TEST_F(UcxSecurityTest, DataMessageWithoutTokenFieldWritesNothing) {
  Build(/*same_host=*/false);
  RawSender forger(target_->Address());
  const std::vector<uint8_t> payload(4096, 0xab);
  // The version-1 header: region, offset, length, connection, batch,
  // blocks; no token.
  DataHeader old = HeaderFor(dst_key_, 0, payload.size(), 1, 1);
  forger.Send(&old, 48, payload.data(), payload.size());
  // Then a valid message on the same endpoint: its ACK is the barrier (the
  // target handles one endpoint's eager AMs in order).
  DataHeader good = HeaderFor(dst_key_, 8192, payload.size(), 2, 1);
  forger.Send(&good, sizeof(good), payload.data(), payload.size());
  const auto& acks = forger.WaitAcks(1);
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(acks[0].first.batch, 2u);
  EXPECT_EQ(acks[0].first.code, 0);
  // Stats runs on the target's progress thread: after it, every write the
  // target made is visible here (the ACK came over a socket).
  EXPECT_EQ(StatsOf(*target_).rejected_token, 1u);
  EXPECT_TRUE(AllZero(dst_.data(), 8192)) << "the token-less write landed";
  EXPECT_EQ(dst_[8192], 0xab);
}

// Anyone who reaches the worker may send a message or an ACK by rendezvous
// (ours are eager): UCX then hands the callback its descriptor of the
// message, not the bytes, with the message's length. Both are refused
// unread; the transport goes on (a copy of `length` bytes from the
// descriptor read past it: ASan's heap overflow, or a crash).
TEST_F(UcxSecurityTest, MessagesAndAcksSentByRendezvousAreRefusedUnread) {
  Build(/*same_host=*/false);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<size_t> handled;  // lengths of the messages the handler got
  target_->SetMessageHandler([&](std::string_view payload) {
    std::lock_guard<std::mutex> lock(mu);
    handled.push_back(payload.size());
    cv.notify_all();
  });
  RawSender forger(target_->Address());
  const std::vector<uint8_t> big(1 << 20, 0xcd);
  forger.Finish(forger.StartRndv(nullptr, 0, big.data(), big.size(), kAmMessage));
  const AckHeader ack{/*connection=*/77, /*batch=*/1, /*code=*/3};
  forger.Finish(forger.StartRndv(&ack, sizeof(ack), big.data(), big.size(), kAmAck));
  // Then an eager message on the same endpoint: the target handles one
  // endpoint's AMs in order, so once it is handled the others were too.
  const std::string after = "after";
  forger.Send(nullptr, 0, after.data(), after.size(), kAmMessage);
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(20), [&] { return !handled.empty(); }));
  }
  EXPECT_EQ(StatsOf(*target_).rejected_rendezvous, 2u);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_THAT(handled, ::testing::ElementsAre(after.size()));
  }
  // The writer's writes still land.
  EXPECT_TRUE(Write(dst_key_, 0, 4096).ok());
  StatsOf(*target_);  // a barrier with the target's progress thread, which wrote
  EXPECT_EQ(dst_[100], src_[100]);
}

// Writes into a region that does not exist, each a new batch announcing
// many blocks: refused by ACK, and no batch is kept open for them (before,
// each opened one that never closed, up to the per-peer bound, and logged an
// error per message).
TEST_F(UcxSecurityTest, WritesIntoAnUnknownRegionKeepNoBatchOpen) {
  Build(/*same_host=*/false, /*max_open=*/8);
  RawSender forger(target_->Address());
  const std::vector<uint8_t> payload(64, 0xcd);
  constexpr uint64_t kSent = 20;  // more than the bound
  for (uint64_t b = 1; b <= kSent; ++b) {
    DataHeader h = HeaderFor(dst_key_, 0, payload.size(), b, uint64_t{1} << 20);
    h.region_id = 0xdeadbeef;
    forger.Send(&h, sizeof(h), payload.data(), payload.size());
  }
  const auto& acks = forger.WaitAcks(kSent);
  ASSERT_EQ(acks.size(), kSent);
  for (const auto& [h, message] : acks) {
    EXPECT_EQ(h.code, static_cast<int32_t>(StatusCode::kInvalidArgument));
    EXPECT_THAT(message, HasSubstr("no such region"));
  }
  IncomingStats stats = StatsOf(*target_);
  EXPECT_EQ(stats.open_batches, 0u);
  EXPECT_EQ(stats.rejected_limit, 0u);
  EXPECT_EQ(stats.rejected_token, kSent);
  // A later block of a batch refused so, into the real region with its
  // token, is refused too: it would open a batch that never completes.
  DataHeader second = HeaderFor(dst_key_, 0, payload.size(), /*batch=*/1, 2);
  forger.Send(&second, sizeof(second), payload.data(), payload.size());
  // The same sender's writes into the real region are still taken.
  DataHeader good = HeaderFor(dst_key_, 4096, payload.size(), 100, 1);
  forger.Send(&good, sizeof(good), payload.data(), payload.size());
  const auto& more = forger.WaitAcks(kSent + 2);
  ASSERT_EQ(more.size(), kSent + 2);
  EXPECT_EQ(more[kSent].first.batch, 1u);
  EXPECT_EQ(more[kSent].first.code, static_cast<int32_t>(StatusCode::kInvalidArgument));
  EXPECT_EQ(more.back().first.batch, 100u);
  EXPECT_EQ(more.back().first.code, 0);
  EXPECT_EQ(StatsOf(*target_).open_batches, 0u);
  EXPECT_EQ(dst_[4096], 0xcd);
  EXPECT_TRUE(AllZero(dst_.data(), 4096)) << "a block of a refused batch was written";
}

// A gathered data AM's header: the DataHeader, then `pieces`.
std::vector<uint8_t> Gathered(const std::string& key, const std::vector<GatherPiece>& pieces,
                              uint64_t total, uint64_t batch) {
  const DataHeader h = HeaderFor(key, 0, total, batch, 1);
  std::vector<uint8_t> out(sizeof(h) + pieces.size() * sizeof(GatherPiece));
  std::memcpy(out.data(), &h, sizeof(h));
  if (!pieces.empty()) std::memcpy(out.data() + sizeof(h), pieces.data(), out.size() - sizeof(h));
  return out;
}

// The writer's scattered pages into one region travel over tcp as a few
// messages with piece tables, and each piece lands where its op said.
TEST_F(UcxSecurityTest, ScatteredWritesIntoOneRegionTravelGatheredOverTcp) {
  Build(/*same_host=*/false);
  auto remote = writer_->ImportRegion(peer_, dst_key_);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  std::vector<WriteOp> ops;
  for (uint64_t i = 0; i < 100; ++i)  // 4 KiB pages, reversed, a page apart
    ops.push_back(WriteOp{src_id_, i * 4096, *remote, (99 - i) * 8192, 4096});
  Completions done;
  ASSERT_TRUE(writer_->PostWrites(peer_, ops, done.Callback()).ok());
  ASSERT_TRUE(done.Wait(1)[0].ok());
  const IncomingStats stats = StatsOf(*target_);
  EXPECT_EQ(stats.gathered_pieces, 100u);
  EXPECT_LE(stats.gathered, 4u) << "one message per page or so";
  for (uint64_t i = 0; i < 100; ++i) {
    const uint64_t at = (99 - i) * 8192;
    EXPECT_EQ(std::memcmp(dst_.data() + at, src_.data() + i * 4096, 4096), 0) << "page " << i;
    EXPECT_TRUE(AllZero(dst_.data() + at + 4096, 4096)) << "after page " << i;
  }
}

// A piece table is checked piece by piece before a byte is written: a piece
// outside the region, one whose end wraps, a total other than the payload,
// half a piece or too many pieces write nothing.
TEST_F(UcxSecurityTest, GatheredPieceTablesAreCheckedPieceByPiece) {
  Build(/*same_host=*/false);
  RawSender forger(target_->Address());
  std::vector<uint8_t> payload(600000);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i % 251 + 1);
  auto send = [&](const std::vector<GatherPiece>& pieces, uint64_t total, uint64_t batch) {
    std::vector<uint8_t> h = Gathered(dst_key_, pieces, total, batch);
    forger.Send(h.data(), h.size(), payload.data(), total);
  };
  send({{8192, 100}, {0, 50}, {20000, 30}}, 180, 1);               // good
  send({{0, 10}, {kRegion - 5, 10}}, 20, 2);                       // past the end
  send({{UINT64_MAX - 4, 10}}, 10, 3);                             // wraps
  send({{0, 10}}, 20, 4);                                          // 10 of 20 bytes
  std::vector<uint8_t> half = Gathered(dst_key_, {{0, 8}}, 8, 5);  // half a piece
  half.resize(half.size() - 8);
  forger.Send(half.data(), half.size(), payload.data(), 8);
  send(std::vector<GatherPiece>(kMaxGatherPieces + 1, {0, 1}), kMaxGatherPieces + 1, 6);
  // Large enough to go by rendezvous: placed through a scatter list.
  std::vector<uint8_t> big = Gathered(dst_key_, {{1 << 20, 300000}, {2 << 20, 300000}}, 600000, 7);
  forger.Finish(forger.StartRndv(big.data(), big.size(), payload.data(), payload.size()));
  const auto& acks = forger.WaitAcks(5);
  ASSERT_EQ(acks.size(), 5u);
  std::map<uint64_t, std::pair<int32_t, std::string>> by_batch;
  for (const auto& [h, message] : acks) by_batch[h.batch] = {h.code, message};
  EXPECT_EQ(by_batch[1].first, 0) << by_batch[1].second;
  EXPECT_EQ(by_batch[7].first, 0) << by_batch[7].second;
  for (uint64_t b : {2, 3, 4})
    EXPECT_EQ(by_batch[b].first, static_cast<int32_t>(StatusCode::kInvalidArgument)) << b;
  EXPECT_THAT(by_batch[2].second, HasSubstr("outside region"));
  EXPECT_THAT(by_batch[3].second, HasSubstr("outside region"));
  EXPECT_THAT(by_batch[4].second, HasSubstr("10 bytes in all"));
  const IncomingStats stats = StatsOf(*target_);
  EXPECT_EQ(stats.rejected_token, 2u) << "half a piece and too many pieces are dropped";
  EXPECT_EQ(stats.gathered, 2u);
  EXPECT_EQ(stats.gathered_pieces, 5u);
  // Exactly the good messages' pieces landed.
  std::vector<uint8_t> want(kRegion, 0);
  std::memcpy(want.data() + 8192, payload.data(), 100);
  std::memcpy(want.data(), payload.data() + 100, 50);
  std::memcpy(want.data() + 20000, payload.data() + 150, 30);
  std::memcpy(want.data() + (1 << 20), payload.data(), 300000);
  std::memcpy(want.data() + (2 << 20), payload.data() + 300000, 300000);
  EXPECT_TRUE(dst_ == want) << "a piece landed where no good table put it";
}

TEST_F(UcxSecurityTest, FloodOfOpenBatchesIsRefusedAndStateStaysBounded) {
  constexpr size_t kLimit = 8;
  constexpr size_t kExtra = 40;
  Build(/*same_host=*/false, kLimit);
  RawSender flooder(target_->Address());
  const std::vector<uint8_t> payload(64, 0xcd);
  // Each batch announces 2 blocks and sends one: it stays open.
  for (uint64_t b = 1; b <= kLimit + kExtra; ++b) {
    DataHeader h = HeaderFor(dst_key_, b * 64, payload.size(), b, 2);
    flooder.Send(&h, sizeof(h), payload.data(), payload.size());
  }
  const auto& acks = flooder.WaitAcks(kExtra);
  ASSERT_EQ(acks.size(), kExtra);
  for (const auto& [h, message] : acks) {
    EXPECT_GT(h.batch, kLimit);
    EXPECT_EQ(h.code, static_cast<int32_t>(StatusCode::kResourceExhausted));
    EXPECT_THAT(message, HasSubstr("max_incoming_batches_per_peer = 8"));
  }
  IncomingStats stats = StatsOf(*target_);
  EXPECT_EQ(stats.open_batches, kLimit);
  EXPECT_EQ(stats.rejected_limit, kExtra);
  // Nothing of a refused batch was written.
  EXPECT_TRUE(AllZero(dst_.data() + (kLimit + 1) * 64, kExtra * 64));
  // Finishing an open batch frees its slot: a new batch is taken again.
  DataHeader second = HeaderFor(dst_key_, 0, payload.size(), 1, 2);
  flooder.Send(&second, sizeof(second), payload.data(), payload.size());
  DataHeader fresh = HeaderFor(dst_key_, 4096, payload.size(), 1000, 1);
  flooder.Send(&fresh, sizeof(fresh), payload.data(), payload.size());
  const auto& more = flooder.WaitAcks(kExtra + 2);
  ASSERT_EQ(more.size(), kExtra + 2);
  EXPECT_EQ(more[kExtra].first.batch, 1u);
  EXPECT_EQ(more[kExtra].first.code, 0);
  EXPECT_EQ(more[kExtra + 1].first.batch, 1000u);
  EXPECT_EQ(more[kExtra + 1].first.code, 0);
  EXPECT_EQ(StatsOf(*target_).open_batches, kLimit - 1);
  EXPECT_EQ(dst_[4096], 0xcd);
  // A batch claiming an absurd block count is refused up front.
  DataHeader huge = HeaderFor(dst_key_, 8192, payload.size(), 2000, ~uint64_t{0});
  flooder.Send(&huge, sizeof(huge), payload.data(), payload.size());
  const auto& last = flooder.WaitAcks(kExtra + 3);
  ASSERT_EQ(last.size(), kExtra + 3);
  EXPECT_EQ(last.back().first.code, static_cast<int32_t>(StatusCode::kResourceExhausted));
  EXPECT_EQ(StatsOf(*target_).rejected_limit, kExtra + 1);
  EXPECT_EQ(dst_[8192], 0);
}

// Per-peer grants: a write under a revoked grant is refused before a byte is
// placed, whatever the writer's path options; other grants keep writing.
TEST_F(UcxSecurityTest, RevokedGrantIsRefusedEagerOrRendezvous) {
  // Same-host paths on and the writer forcing one-sided puts: a grant key
  // offers neither, so every write goes through the target's admission.
  Build(/*same_host=*/true, 4096, std::chrono::milliseconds(5000), /*writer_put=*/true);
  auto g1 = target_->GrantRegion(dst_id_, 1, kMediated);
  auto g2 = target_->GrantRegion(dst_id_, 2, kMediated);
  ASSERT_TRUE(g1.ok() && g2.ok()) << g1.status().ToString();
  ASSERT_TRUE(Write(*g1, 0, 4096).ok());
  EXPECT_EQ(*writer_->PathTo(peer_), DataPath::kUcxRendezvous);
  ASSERT_TRUE(Write(*g1, 1 << 20, 1 << 20).ok());
  // Stats runs on the target's progress thread: its writes happen before our
  // reads and our memset (their ACKs come through UCX, which TSan cannot see).
  StatsOf(*target_);
  EXPECT_EQ(std::memcmp(dst_.data() + (1 << 20), src_.data() + (1 << 20), 1 << 20), 0);
  std::fill(dst_.begin(), dst_.end(), 0);
  ASSERT_TRUE(target_->RevokeGrant(1).ok());
  uint64_t refused = 0;
  for (uint64_t length : {uint64_t{4096}, uint64_t{1} << 20}) {
    Status st = Write(*g1, 0, length);
    EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.ToString();
    EXPECT_THAT(st.message(), HasSubstr("grant was revoked"));
    EXPECT_TRUE(AllZero(dst_.data(), kRegion)) << "write of " << length << " under a revoked grant";
    // After the read: StatsOf runs on the target's progress thread, which
    // orders this read before the target places the next write (g2's
    // below). That order otherwise travels only through UCX's shared memory,
    // which TSan cannot see (a false data race in a TSan run).
    IncomingStats stats = StatsOf(*target_);
    EXPECT_EQ(stats.rejected_revoked, ++refused);
  }
  ASSERT_TRUE(Write(*g2, 0, 4096).ok());
  StatsOf(*target_);  // the write placed before our read, as above
  EXPECT_EQ(dst_[100], src_[100]);
  EXPECT_EQ(target_->RevokeGrant(99).code(), StatusCode::kNotFound);
  EXPECT_EQ(target_->GrantRegion(dst_id_ + 100, 3, kMediated).status().code(),
            StatusCode::kNotFound);
}

// A same-host mapping grant: the owner hands its memory over (here by
// cross-memory attach: heap memory) for this grant's token alone, a token
// of its own, and refuses a new mapping under it once revoked; another
// peer's grant maps on. A mediated grant names no same-host socket.
TEST_F(UcxSecurityTest, SameHostMappingGrantMapsForItsOwnTokenUntilRevoked) {
  Build(/*same_host=*/true);
  constexpr auto kMapping = Transport::GrantReach::kSameHostMapping;
  auto g1 = target_->GrantRegion(dst_id_, 1, kMapping);
  auto g2 = target_->GrantRegion(dst_id_, 2, kMapping);
  auto g3 = target_->GrantRegion(dst_id_, 3, kMediated);
  ASSERT_TRUE(g1.ok() && g2.ok() && g3.ok()) << g1.status().ToString();
  auto own = DecodeRemoteKey(dst_key_);
  auto b1 = DecodeRemoteKey(*g1);
  auto b2 = DecodeRemoteKey(*g2);
  auto b3 = DecodeRemoteKey(*g3);
  ASSERT_TRUE(own.ok() && b1.ok() && b2.ok() && b3.ok());
  EXPECT_FALSE(b1->same_host_socket.empty());
  EXPECT_TRUE(b1->packed_rkey.empty());  // no one-sided lane under a grant
  EXPECT_TRUE(b3->same_host_socket.empty());
  EXPECT_FALSE(TokensEqual(b1->token, own->token));
  EXPECT_FALSE(TokensEqual(b1->token, b2->token));

  ASSERT_TRUE(Write(*g1, 0, 4096).ok());
  EXPECT_EQ(*writer_->PathTo(peer_), DataPath::kCrossMemoryAttach);
  EXPECT_EQ(std::memcmp(dst_.data(), src_.data(), 4096), 0);
  // The grant's socket with another token: refused by the owner, no write.
  const std::string forged = Reencode(*g1, [](RemoteKeyBlob& b) { b.token.bytes[3] ^= 1; });
  auto fresh = writer_->Connect(target_->Address());
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(writer_->ImportRegion(*fresh, forged).status().code(), StatusCode::kPermissionDenied);

  ASSERT_TRUE(target_->RevokeGrant(1).ok());
  // A writer that comes for the memory after the revoke gets none of it.
  auto after = writer_->Connect(target_->Address());
  ASSERT_TRUE(after.ok());
  auto refused = writer_->ImportRegion(*after, *g1);
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied) << refused.status().ToString();
  auto other = writer_->ImportRegion(*after, *g2);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  Completions done;
  ASSERT_TRUE(
      writer_->PostWrites(*after, {WriteOp{src_id_, 8192, *other, 8192, 4096}}, done.Callback())
          .ok());
  ASSERT_TRUE(done.Wait(1)[0].ok());
  EXPECT_EQ(*writer_->PathTo(*after), DataPath::kCrossMemoryAttach);
  EXPECT_EQ(std::memcmp(dst_.data() + 8192, src_.data() + 8192, 4096), 0);
}

// A rendezvous receive admitted before the revoke: RevokeGrant does not
// return OK while it can still land (DeadlineExceeded while the sender is
// stalled), and returns OK once it has landed.
TEST_F(UcxSecurityTest, RevokeWaitsForAReceiveAdmittedBeforeIt) {
  Build(/*same_host=*/false, 4096, std::chrono::milliseconds(300));
  auto g1 = target_->GrantRegion(dst_id_, 1, kMediated);
  ASSERT_TRUE(g1.ok());
  RawSender sender(target_->Address());
  const std::vector<uint8_t> payload(kRegion, 0x5a);
  DataHeader h = HeaderFor(*g1, 0, payload.size(), 1, 1);
  ucs_status_ptr_t req = sender.StartRndv(&h, sizeof(h), payload.data(), payload.size());
  ASSERT_NE(req, nullptr) << "a 4 MiB rendezvous send completed at once";
  // Progress the sender only until the target has admitted the block (the
  // batch is open): the receive then waits on the stalled sender.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (StatsOf(*target_).open_batches == 0 && std::chrono::steady_clock::now() < deadline) {
    sender.Progress();
  }
  ASSERT_EQ(StatsOf(*target_).open_batches, 1u) << "the rendezvous block was never admitted";
  Status first = target_->RevokeGrant(1);
  EXPECT_EQ(first.code(), StatusCode::kDeadlineExceeded) << first.ToString();
  EXPECT_THAT(first.message(), HasSubstr("may still write"));
  // Let the sender move, and revoke again: OK only after the bytes landed.
  std::atomic<bool> stop{false};
  std::thread mover([&] {
    while (!stop.load()) sender.Progress();
  });
  Status second = target_->RevokeGrant(1);
  EXPECT_TRUE(second.ok()) << second.ToString();
  EXPECT_EQ(std::memcmp(dst_.data(), payload.data(), payload.size()), 0);
  EXPECT_EQ(StatsOf(*target_).open_batches, 0u);
  stop = true;
  mover.join();
  sender.Finish(req);
  const auto& acks = sender.WaitAcks(1);
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(acks[0].first.code, 0) << acks[0].second;
}

}  // namespace
}  // namespace kvbridge::internal::ucx
