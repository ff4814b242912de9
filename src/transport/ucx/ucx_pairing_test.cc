// Disconnect closes one direction only (transport.h: connections are
// one-directional). UCX pairs the endpoints two workers open to each other,
// so closing ours once closed the one the other process wrote to us over:
// its next write got no ACK, ever (UcxTransport::LingerOrClose).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <vector>

#include "kvbridge/memory.h"
#include "transport/test_util.h"
#include "transport/ucx/ucx_test_util.h"
#include "transport/ucx/ucx_transport_impl.h"

namespace kvbridge::internal::ucx {
namespace {

using namespace std::chrono_literals;

// Every write acknowledged over UCX.
std::unique_ptr<Transport> Make(const char* name) {
  return testing::MakeUcxForTest(testing::TcpTestOptions(name, /*same_host=*/false));
}

// One 4 KiB write; whether its ACK came within `limit`.
bool WriteAcked(Transport& writer, PeerId peer, RegionId src, RemoteRegionId dst,
                std::chrono::seconds limit) {
  auto done = std::make_shared<std::promise<Status>>();
  auto acked = done->get_future();
  Status posted = writer.PostWrites(peer, {WriteOp{src, 0, dst, 0, 4096}},
                                    [done](const Status& s) { done->set_value(s); });
  if (!posted.ok()) return false;
  if (acked.wait_for(limit) != std::future_status::ready) return false;
  return acked.get().ok();
}

TEST(UcxPairingTest, ClosingOurEndpointLeavesThePeersEndpointToUsWorking) {
  testing::Gate hello;  // before the transports: their threads may call in until they go
  auto target = Make("target");
  auto writer = Make("writer");
  ASSERT_TRUE(target && writer);
  writer->SetMessageHandler([&](std::string_view) { hello.Open(); });
  std::vector<uint8_t> src(1 << 16, 7), dst(1 << 16, 0);
  auto s = writer->RegisterMemory(src.data(), src.size(), MemoryKind::kDram);
  auto d = target->RegisterMemory(dst.data(), dst.size(), MemoryKind::kDram);
  ASSERT_TRUE(s.ok() && d.ok());
  // As decode's Hello: the target's endpoint first, used, then the writer's.
  auto to_writer = target->Connect(writer->Address());
  ASSERT_TRUE(to_writer.ok()) << to_writer.status().ToString();
  ASSERT_TRUE(target->SendMessage(*to_writer, "hello").ok());
  hello.Wait();
  auto to_target = writer->Connect(target->Address());
  ASSERT_TRUE(to_target.ok()) << to_target.status().ToString();
  auto remote = writer->ImportRegion(*to_target, d->remote_key);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  // A second endpoint of the target's stays open (its Hello sent again).
  auto again = target->Connect(writer->Address());
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(WriteAcked(*writer, *to_target, s->id, *remote, 10s)) << "before any close";

  target->Disconnect(*to_writer);
  // The limit is far above a working ACK's milliseconds; a lost one never
  // comes.
  EXPECT_TRUE(WriteAcked(*writer, *to_target, s->id, *remote, 10s))
      << "the writer's endpoint died with the target's closed one";
  // Stats runs on the target's progress thread, which wrote the bytes: a
  // barrier ThreadSanitizer sees (the ACK travels through the kernel).
  static_cast<UcxTransport&>(*target).Stats();
  EXPECT_EQ(dst[0], 7);
}

// The same with no other endpoint to keep ours lingering: closed for real,
// it still leaves the writer's endpoint alone (out_worker_ makes ours, so
// UCX never paired the two).
TEST(UcxPairingTest, ClosingOurLastEndpointLeavesThePeersEndpointToUsWorking) {
  testing::Gate hello;  // before the transports: their threads may call in until they go
  auto target = Make("target");
  auto writer = Make("writer");
  ASSERT_TRUE(target && writer);
  writer->SetMessageHandler([&](std::string_view) { hello.Open(); });
  std::vector<uint8_t> src(1 << 16, 7), dst(1 << 16, 0);
  auto s = writer->RegisterMemory(src.data(), src.size(), MemoryKind::kDram);
  auto d = target->RegisterMemory(dst.data(), dst.size(), MemoryKind::kDram);
  ASSERT_TRUE(s.ok() && d.ok());
  auto to_writer = target->Connect(writer->Address());
  ASSERT_TRUE(to_writer.ok()) << to_writer.status().ToString();
  ASSERT_TRUE(target->SendMessage(*to_writer, "hello").ok());
  hello.Wait();
  auto to_target = writer->Connect(target->Address());
  ASSERT_TRUE(to_target.ok()) << to_target.status().ToString();
  auto remote = writer->ImportRegion(*to_target, d->remote_key);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  ASSERT_TRUE(WriteAcked(*writer, *to_target, s->id, *remote, 10s)) << "before any close";
  target->Disconnect(*to_writer);
  EXPECT_EQ(static_cast<UcxTransport&>(*target).Stats().lingering, 0u) << "closed, not lingering";
  EXPECT_TRUE(WriteAcked(*writer, *to_target, s->id, *remote, 10s))
      << "the writer's endpoint died with the target's closed one";
  static_cast<UcxTransport&>(*target).Stats();
  EXPECT_EQ(dst[0], 7);
}

// What broke a healed partition: the two sides had made different numbers
// of endpoints to each other (prefill answered a Hello sent twice), so the
// target's extra one had no partner yet; it was closed, and the writer's
// next endpoint, which UCX paired with it by sequence number, died with it
// ("Connection reset by remote peer"). Endpoints made after any such close
// must work.
TEST(UcxPairingTest, AnEndpointMadeAfterThePeerClosedAnUnpairedOneWorks) {
  // Before the transports: their threads may call in until they go.
  std::atomic<int> writer_failures{0};
  testing::Gate hello;
  auto target = Make("target");
  auto writer = Make("writer");
  ASSERT_TRUE(target && writer);
  writer->SetPeerFailureHandler([&](PeerId, const Status&) { ++writer_failures; });
  writer->SetMessageHandler([&](std::string_view) { hello.Open(); });
  std::vector<uint8_t> src(1 << 16, 7), dst(1 << 16, 0);
  auto s = writer->RegisterMemory(src.data(), src.size(), MemoryKind::kDram);
  auto d = target->RegisterMemory(dst.data(), dst.size(), MemoryKind::kDram);
  ASSERT_TRUE(s.ok() && d.ok());
  // The target makes two endpoints to the writer, the writer one back.
  auto first = target->Connect(writer->Address());
  auto extra = target->Connect(writer->Address());
  ASSERT_TRUE(first.ok() && extra.ok());
  ASSERT_TRUE(target->SendMessage(*extra, "hello").ok());
  hello.Wait();
  auto old_to_target = writer->Connect(target->Address());
  ASSERT_TRUE(old_to_target.ok());
  // Every endpoint of the target's goes (the last one closes them all).
  target->Disconnect(*first);
  target->Disconnect(*extra);
  writer->Disconnect(*old_to_target);
  EXPECT_EQ(static_cast<UcxTransport&>(*target).Stats().lingering, 0u);
  // The writer's next endpoint: the second it made to the target.
  auto to_target = writer->Connect(target->Address());
  ASSERT_TRUE(to_target.ok()) << to_target.status().ToString();
  auto remote = writer->ImportRegion(*to_target, d->remote_key);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  for (int i = 0; i < 20; ++i)
    ASSERT_TRUE(WriteAcked(*writer, *to_target, s->id, *remote, 10s)) << "write " << i;
  static_cast<UcxTransport&>(*target).Stats();
  EXPECT_EQ(dst[0], 7);
  // The writer's progress thread has run every failure callback of its
  // endpoints posted before this call returns.
  static_cast<UcxTransport&>(*writer).Stats();
  EXPECT_EQ(writer_failures.load(), 0) << "an endpoint of the writer's failed";
}

// Which endpoints stay paired (same host, shared memory possible): the
// rule that picks out_worker_.
TEST(UcxPairingTest, SharedMemoryIsPossibleUnlessUcxTlsNamesNone) {
  for (const char* tls : {"", "^ib", "all", "sm", "tcp,posix", "cma,tcp", "sysv"})
    EXPECT_TRUE(MayUseSharedMemory(tls)) << tls;
  for (const char* tls : {"tcp", "tcp,ib", "rc,ud", "tcp,"})
    EXPECT_FALSE(MayUseSharedMemory(tls)) << tls;
}

// What lingers is bounded per process, and goes with the last endpoint.
TEST(UcxPairingTest, LingeringEndpointsAreBoundedAndCloseWithTheLastOne) {
  auto target = Make("target");
  auto writer = Make("writer");
  ASSERT_TRUE(target && writer);
  auto& t = static_cast<UcxTransport&>(*target);
  auto live = target->Connect(writer->Address());
  ASSERT_TRUE(live.ok());
  constexpr size_t kClosed = UcxTransport::kMaxLingering + 4;
  for (size_t i = 0; i < kClosed; ++i) {
    auto e = target->Connect(writer->Address());
    ASSERT_TRUE(e.ok());
    target->Disconnect(*e);
  }
  // Stats runs after every close posted before it (one progress thread).
  EXPECT_EQ(t.Stats().lingering, UcxTransport::kMaxLingering);
  target->Disconnect(*live);
  EXPECT_EQ(t.Stats().lingering, 0u);
}

}  // namespace
}  // namespace kvbridge::internal::ucx
