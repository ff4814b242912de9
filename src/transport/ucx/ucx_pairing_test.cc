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

// A target and a writer over UCX TCP, each with 64 KiB registered; the
// writer counts its endpoints' failures and opens `hello` on a message.
class UcxPairingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    target = Make("target");
    writer = Make("writer");
    ASSERT_TRUE(target && writer);
    writer->SetPeerFailureHandler([this](PeerId, const Status&) { ++writer_failures; });
    writer->SetMessageHandler([this](std::string_view) { hello.Open(); });
    auto s = writer->RegisterMemory(src.data(), src.size(), MemoryKind::kDram);
    auto d = target->RegisterMemory(dst.data(), dst.size(), MemoryKind::kDram);
    ASSERT_TRUE(s.ok() && d.ok());
    src_id = s->id;
    dst_key = d->remote_key;
  }

  // The writer's endpoint to the target, with the target's region imported.
  void ConnectWriter(PeerId* to_target, RemoteRegionId* remote) {
    auto c = writer->Connect(target->Address());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto r = writer->ImportRegion(*c, dst_key);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    *to_target = *c;
    *remote = *r;
  }

  // As decode's Hello: the target's endpoint first, used, then the
  // writer's. The target then closes its endpoint (`keep_another`: a second
  // of its stays open, as when a Hello was sent again, so the closed one
  // lingers) and the writer's next write must still be acknowledged: the
  // limit is far above a working ACK's milliseconds, a lost one never comes.
  void CloseTheTargetsHelloEndpoint(bool keep_another) {
    auto to_writer = target->Connect(writer->Address());
    ASSERT_TRUE(to_writer.ok()) << to_writer.status().ToString();
    ASSERT_TRUE(target->SendMessage(*to_writer, "hello").ok());
    hello.Wait();
    PeerId to_target = 0;
    RemoteRegionId remote{};
    ASSERT_NO_FATAL_FAILURE(ConnectWriter(&to_target, &remote));
    if (keep_another) {
      ASSERT_TRUE(target->Connect(writer->Address()).ok());
    }
    ASSERT_TRUE(Acked(to_target, remote)) << "before any close";
    target->Disconnect(*to_writer);
    EXPECT_EQ(TargetLingering(), keep_another ? 1u : 0u);
    EXPECT_TRUE(Acked(to_target, remote))
        << "the writer's endpoint died with the target's closed one";
    TargetLingering();
    EXPECT_EQ(dst[0], 7);
  }

  bool Acked(PeerId to_target, RemoteRegionId remote) {
    return WriteAcked(*writer, to_target, src_id, remote, 10s);
  }

  // Stats runs on the target's progress thread, which wrote the bytes: a
  // barrier ThreadSanitizer sees (the ACK travels through the kernel).
  uint64_t TargetLingering() { return static_cast<UcxTransport&>(*target).Stats().lingering; }

  // Declared first, gone last: the transports' threads may call in until
  // the transports go.
  std::atomic<int> writer_failures{0};
  testing::Gate hello;
  std::vector<uint8_t> src = std::vector<uint8_t>(1 << 16, 7);
  std::vector<uint8_t> dst = std::vector<uint8_t>(1 << 16, 0);
  std::unique_ptr<Transport> target, writer;
  RegionId src_id{};
  std::string dst_key;
};

TEST_F(UcxPairingTest, ClosingOurEndpointLeavesThePeersEndpointToUsWorking) {
  CloseTheTargetsHelloEndpoint(/*keep_another=*/true);
}

// The same with no other endpoint to keep ours lingering: closed for real,
// it still leaves the writer's endpoint alone (out_worker_ makes ours, so
// UCX never paired the two).
TEST_F(UcxPairingTest, ClosingOurLastEndpointLeavesThePeersEndpointToUsWorking) {
  CloseTheTargetsHelloEndpoint(/*keep_another=*/false);
}

// What broke a healed partition: the two sides had made different numbers
// of endpoints to each other (prefill answered a Hello sent twice), so the
// target's extra one had no partner yet; it was closed, and the writer's
// next endpoint, which UCX paired with it by sequence number, died with it
// ("Connection reset by remote peer"). Endpoints made after any such close
// must work.
TEST_F(UcxPairingTest, AnEndpointMadeAfterThePeerClosedAnUnpairedOneWorks) {
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
  EXPECT_EQ(TargetLingering(), 0u);
  // The writer's next endpoint: the second it made to the target.
  PeerId to_target = 0;
  RemoteRegionId remote{};
  ASSERT_NO_FATAL_FAILURE(ConnectWriter(&to_target, &remote));
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(Acked(to_target, remote)) << "write " << i;
  TargetLingering();
  EXPECT_EQ(dst[0], 7);
  // The writer's progress thread has run every failure callback of its
  // endpoints posted before this call returns.
  static_cast<UcxTransport&>(*writer).Stats();
  EXPECT_EQ(writer_failures.load(), 0) << "an endpoint of the writer's failed";
}

// Which endpoints stay paired (same host, shared memory possible): the
// rule that picks out_worker_.
TEST(UcxPairingRuleTest, SharedMemoryIsPossibleUnlessUcxTlsNamesNone) {
  for (const char* tls : {"", "^ib", "all", "sm", "tcp,posix", "cma,tcp", "sysv"})
    EXPECT_TRUE(MayUseSharedMemory(tls)) << tls;
  for (const char* tls : {"tcp", "tcp,ib", "rc,ud", "tcp,"})
    EXPECT_FALSE(MayUseSharedMemory(tls)) << tls;
}

// What lingers is bounded per process, and goes with the last endpoint.
TEST_F(UcxPairingTest, LingeringEndpointsAreBoundedAndCloseWithTheLastOne) {
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
