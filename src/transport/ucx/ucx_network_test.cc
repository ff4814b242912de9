// ConnectOverNetwork (transport.h): an endpoint to a peer on this host whose
// messages and writes avoid UCX's shared-memory queues, which a process
// killed while writing into one can leave blocked for every later writer.
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "transport/test_util.h"
#include "transport/ucx/ucx_blobs.h"
#include "transport/ucx/ucx_test_util.h"

namespace kvbridge::internal::ucx {
namespace {

// Every UCX transport this build has (shared memory included), with UCX's
// own data path: the endpoint's lanes say which transports it chose.
UcxTransportOptions AllTransports(const char* name) {
  UcxTransportOptions o;
  o.same_host_paths = false;
  o.name = name;
  return o;
}

TEST(UcxNetworkTest, AnEndpointOverTheNetworkUsesNoSharedMemoryAndCarriesEverything) {
  auto target = testing::MakeUcxForTest(AllTransports("target"));
  auto sender = testing::MakeUcxForTest(AllTransports("sender"));
  ASSERT_TRUE(target && sender);
  Result<AddressBlob> blob = DecodeAddress(target->Address());
  ASSERT_TRUE(blob.ok()) << blob.status().ToString();
  ASSERT_FALSE(blob->network_address.empty()) << "no network device in the address";
  EXPECT_LT(blob->network_address.size(), blob->worker_address.size());

  std::mutex mu;
  std::vector<std::string> got;
  testing::Gate two;
  target->SetMessageHandler([&](std::string_view m) {
    std::lock_guard<std::mutex> lock(mu);
    got.emplace_back(m);
    if (got.size() == 2) two.Open();
  });
  std::vector<uint8_t> dst(4096, 0), src(4096, 0x5a);
  auto region = target->RegisterMemory(dst.data(), dst.size(), MemoryKind::kDram);
  auto local = sender->RegisterMemory(src.data(), src.size(), MemoryKind::kDram);
  ASSERT_TRUE(region.ok() && local.ok());

  auto usual = sender->Connect(target->Address());
  auto network = sender->ConnectOverNetwork(target->Address());
  ASSERT_TRUE(usual.ok() && network.ok());
  auto usual_region = sender->ImportRegion(*usual, region->remote_key);
  auto network_region = sender->ImportRegion(*network, region->remote_key);
  ASSERT_TRUE(usual_region.ok() && network_region.ok());
  // Same host: UCX's own choice includes a shared-memory transport; the
  // network endpoint has TCP lanes only.
  EXPECT_NE(sender->WireTo(*usual), "tcp") << sender->WireTo(*usual);
  EXPECT_EQ(sender->WireTo(*network), "tcp");

  testing::Completions done;
  std::vector<WriteOp> ops{WriteOp{local->id, 0, *network_region, 0, 4096}};
  ASSERT_TRUE(sender->PostWrites(*network, std::move(ops), done.Callback()).ok());
  ASSERT_TRUE(sender->SendMessage(*network, "over the network").ok());
  ASSERT_TRUE(sender->SendMessage(*usual, "as usual").ok());
  two.Wait();
  ASSERT_TRUE(done.Wait(1)[0].ok()) << done.Wait(1)[0].ToString();
  EXPECT_EQ(dst, src);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(std::count(got.begin(), got.end(), "over the network"), 1);
  EXPECT_EQ(std::count(got.begin(), got.end(), "as usual"), 1);
}

// UCX pairs the k-th endpoint one worker makes to another with the k-th
// that one makes back (its wire-up matches them by sequence number), and
// UCX 1.13 aborts the process ("endpoint reconfiguration not supported
// yet") when the two were made for different transports. kvbridge makes
// endpoints both ways between two ranks (decode's Hello, prefill's
// connection back, a Hello tried again over the network), so a network
// endpoint must never be paired with a usual one: seen as prefill aborting
// in `kvbridge bench requests --prefill-tp 2 --decode-tp 1`, where a slow
// handshake made decode try its Hello again over the network.
TEST(UcxNetworkTest, NetworkAndUsualEndpointsMadeBothWaysAreNeverPairedByUcx) {
  auto a = testing::MakeUcxForTest(AllTransports("a"));
  auto b = testing::MakeUcxForTest(AllTransports("b"));
  ASSERT_TRUE(a && b);
  std::mutex mu;
  std::vector<std::string> at_a, at_b;
  testing::Gate a_done, b_done;
  constexpr size_t kEach = 4;
  a->SetMessageHandler([&](std::string_view m) {
    std::lock_guard<std::mutex> lock(mu);
    at_a.emplace_back(m);
    if (at_a.size() == kEach) a_done.Open();
  });
  b->SetMessageHandler([&](std::string_view m) {
    std::lock_guard<std::mutex> lock(mu);
    at_b.emplace_back(m);
    if (at_b.size() == kEach) b_done.Open();
  });
  // Each round: a's and b's k-th endpoints to each other, one of them over
  // the network (b's in odd rounds, a's in even ones), made in both orders.
  std::vector<std::pair<Transport*, PeerId>> eps;
  for (int round = 0; round < 4; ++round) {
    const bool b_network = round % 2 == 1;
    auto from_a = [&] {
      auto p = b_network ? a->Connect(b->Address()) : a->ConnectOverNetwork(b->Address());
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      eps.emplace_back(a.get(), *p);
    };
    auto from_b = [&] {
      auto p = b_network ? b->ConnectOverNetwork(a->Address()) : b->Connect(a->Address());
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      eps.emplace_back(b.get(), *p);
    };
    if (round < 2) {
      from_a();
      from_b();
    } else {
      from_b();
      from_a();
    }
  }
  for (auto& [t, peer] : eps) {
    ASSERT_TRUE(t->SendMessage(peer, t == a.get() ? "from a" : "from b").ok());
  }
  a_done.Wait();
  b_done.Wait();
  // Each network endpoint still has TCP lanes only (paired with a usual
  // one, it would have taken that one's transports, or aborted).
  std::vector<uint8_t> a_mem(4096), b_mem(4096);
  auto a_region = a->RegisterMemory(a_mem.data(), a_mem.size(), MemoryKind::kDram);
  auto b_region = b->RegisterMemory(b_mem.data(), b_mem.size(), MemoryKind::kDram);
  ASSERT_TRUE(a_region.ok() && b_region.ok());
  for (size_t i = 0; i < eps.size(); ++i) {
    const int round = static_cast<int>(i / 2);
    const bool from_a = (i % 2 == 0) == (round < 2);
    const bool network = from_a != (round % 2 == 1);
    auto& [t, peer] = eps[i];
    ASSERT_TRUE(t->ImportRegion(peer, (from_a ? b_region : a_region)->remote_key).ok());
    if (network) {
      EXPECT_EQ(t->WireTo(peer), "tcp") << "endpoint " << i;
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(at_a.size(), kEach);
  EXPECT_EQ(at_b.size(), kEach);
}

}  // namespace
}  // namespace kvbridge::internal::ucx
