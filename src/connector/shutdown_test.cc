// Destroying a manager with traffic in flight (issue 10, defect 6): writes
// complete and messages arrive on transport threads while the manager goes
// away; nothing may touch the engine, the metrics or the manager after they
// are gone (the ASan and TSan builds run this too).
#include <gtest/gtest.h>

#include "connector/connector_test_util.h"
#include "control/auth.h"
#include "control/bootstrap_client.h"
#include "transport/fault/fault_transport.h"

namespace kvbridge::internal {
namespace {

class ShutdownTest : public ::testing::TestWithParam<bool> {};

TEST_P(ShutdownTest, ManagersGoWhileWritesAndNoticesAreInFlight) {
  const bool prefill_first = GetParam();
  std::vector<FaultTransport*> faults;
  ClusterOptions o;
  o.prefill_tp = 2;
  o.decode_tp = 2;
  o.tweak = [](ManagerOptions& m) {
    TolerantLiveness(m);
    m.metrics_port = -1;  // metrics on: their object goes with the manager
  };
  o.wrap = WrapInFaults(&faults);
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  TestCluster& cluster = **c;
  std::vector<Request> requests;
  for (uint64_t room = 1; room <= 6; ++room)
    requests.push_back(Request{.room = room,
                               .src = Scattered(8, 64, static_cast<uint32_t>(room)),
                               .dst = Scattered(8, 64, static_cast<uint32_t>(room + 50))});
  for (Request& r : requests)
    ASSERT_NO_FATAL_FAILURE(Start(cluster, r, /*senders_first=*/r.room % 2 == 0));
  // Writes complete on the fault transports' threads 200 ms after they are
  // posted: while the managers are being destroyed.
  for (FaultTransport* f : faults) f->DelayWrites(std::chrono::milliseconds(200));
  for (Request& r : requests) ASSERT_NO_FATAL_FAILURE(SendChunks(r, {3, 5}));
  ASSERT_GT(faults[0]->counters().batches_delayed, 0u);
  // The test proves something only if traffic is still under way.
  int unfinished = 0;
  for (Request& r : requests)
    for (auto& rx : r.receivers) unfinished += rx->Poll() != KVPoll::kSuccess;
  ASSERT_GT(unfinished, 0) << "every request finished before the managers went";
  // Rooms go first (as an application releases them), then the managers,
  // one side after the other, with writes and notices still under way.
  for (Request& r : requests) {
    r.senders.clear();
    r.receivers.clear();
  }
  auto& first = prefill_first ? cluster.prefill : cluster.decode;
  auto& second = prefill_first ? cluster.decode : cluster.prefill;
  for (auto& rank : first) rank.manager.reset();
  for (auto& rank : second) rank.manager.reset();
}

// A failure record still queued for the registry when the manager goes is
// published on the way out. The registry thread publishes once per
// heartbeat (5 s here: no round comes first), and the sglang adapter drops
// an evicted manager right after a failure: the record went with it, and
// the other ranks of the request's group never learnt why.
TEST(ShutdownRecordTest, ARecordStillQueuedIsPublishedBeforeTheManagerGoes) {
  ClusterOptions o;
  o.tweak = [](ManagerOptions& m) { m.heartbeat_interval = std::chrono::seconds(5); };
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  TestCluster& cluster = **c;
  const RankId self = cluster.decode[0].manager->self();
  cluster.decode[0].manager->ReportFatal("the test's own fatal error");
  cluster.decode[0].manager.reset();  // the destructor publishes: no wait after it
  auto client = BootstrapClient::Create(cluster.server->address(), std::chrono::milliseconds(2000),
                                        AuthTokenFromEnvironment());
  ASSERT_TRUE(client.ok());
  Result<FailureBatch> b = (*client)->FailuresSince(0);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  int found = 0;
  for (const auto& j : b->records)
    found += j.value("detail", "") == "the test's own fatal error" &&
             j["origin"].value("incarnation", uint64_t{0}) == self.incarnation;
  EXPECT_EQ(found, 1) << "the registry holds: " << nlohmann::json(b->records).dump();
}

INSTANTIATE_TEST_SUITE_P(Order, ShutdownTest, ::testing::Bool(), [](const auto& info) {
  return std::string(info.param ? "PrefillFirst" : "DecodeFirst");
});

}  // namespace
}  // namespace kvbridge::internal
