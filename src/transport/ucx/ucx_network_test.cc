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

}  // namespace
}  // namespace kvbridge::internal::ucx
