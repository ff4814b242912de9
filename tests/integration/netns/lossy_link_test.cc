// A lossy link between hosts: 5% of host 1's packets dropped at random both
// ways (nftables numgen), alone and with 20 ms delay each way on the same
// link (HostNet::Delay: this kernel has no netem). No request may fail for
// it: TCP retransmits, and liveness must not take a slow, lossy link for a
// dead peer.
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/integration/netns/hosts_util.h"

namespace kvbridge::tools {
namespace {

using std::chrono::milliseconds;

// Runs `requests` through `layout` (by default prefill on host 1 and decode
// on host 2, the registry on host 0) and checks that every one succeeded,
// every page verified.
void RunAndExpectNoFailure(HostNet& net, int requests, std::vector<std::string> workload,
                           const char* tag,
                           HostsLayout layout = {
                               .prefill_tp = 1, .decode_tp = 1, .rank_hosts = {1, 2}}) {
  const std::string logs = NewLogDir();
  auto started = StartCluster(net, layout, 0, std::move(workload), logs);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  Cluster& c = **started;
  Status s = c.CollectReports(milliseconds(180000));
  ASSERT_TRUE(s.ok()) << s.ToString() << " (logs in " << logs << ")";
  for (int i = 0; i < c.num_ranks(); ++i) {
    const ProcessInfo& p = c.process(i);
    SCOPED_TRACE(p.name);
    ASSERT_TRUE(p.report.has_value()) << p.exit.ToString();
    const auto& r = *p.report;
    // The first failure says why (the others mostly repeat it).
    EXPECT_EQ(r["succeeded"].get<int>(), requests)
        << (r["failures"].empty() ? std::string() : r["failures"][0].dump());
    EXPECT_EQ(r["failed"].get<int>(), 0);
    EXPECT_EQ(r["corrupt_pages"].get<int>(), 0);
    if (p.role == Role::kDecode) {
      EXPECT_GT(r["verified_pages"].get<uint64_t>(), 0u);
    }
    std::printf("%s %s succeeded=%d p50_us=%.0f p99_us=%.0f\n", tag, p.name.c_str(),
                r["succeeded"].get<int>(), r["p50_us"].get<double>(), r["p99_us"].get<double>());
  }
  c.Shutdown(milliseconds(10000));
}

TEST(LossyLinkTest, FivePercentLossFailsNoRequest) {
  KVB_SKIP_WITHOUT_HOSTS();
  auto created = HostNet::Create(3);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  HostNet& net = **created;
  ASSERT_TRUE(net.Lossy(1, 5).ok());
  constexpr int kRequests = 240;
  RunAndExpectNoFailure(net, kRequests, LossyLinkWorkload(kRequests, 8), "LOSSY");
}

// 5% loss and 20 ms each way (a 40 ms round trip) on host 1's link, the
// same workload.
TEST(LossyLinkTest, FivePercentLossAndTwentyMsDelayFailsNoRequest) {
  KVB_SKIP_WITHOUT_HOSTS();
  auto created = HostNet::Create(3);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  HostNet& net = **created;
  ASSERT_TRUE(net.Lossy(1, 5).ok());
  ASSERT_TRUE(net.Delay(1, 20, std::string(KVB_BIN_DIR) + "/kvbridge").ok());
  constexpr int kRequests = 240;
  RunAndExpectNoFailure(net, kRequests, LossyLinkWorkload(kRequests, 8), "LOSSY+DELAY");
}

// Tensor-parallel siblings across the lossy link, laid out as `kvbridge demo
// --hosts 3 --fault lossy-link` does: both prefill ranks with the registry on
// host 0, decode tp0 on host 1, decode tp1 on host 2 behind 5% loss and 20 ms
// delay. Decode tp0 judges its sibling by the age of its last heartbeat at
// the registry: a heartbeat that lost a packet must not read as a dead rank.
TEST(LossyLinkTest, SiblingsAcrossALossyLinkAreNotFailedByRegistryLiveness) {
  KVB_SKIP_WITHOUT_HOSTS();
  auto created = HostNet::Create(3);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  HostNet& net = **created;
  ASSERT_TRUE(net.Lossy(2, 5).ok());
  ASSERT_TRUE(net.Delay(2, 20, std::string(KVB_BIN_DIR) + "/kvbridge").ok());
  constexpr int kRequests = 240;
  RunAndExpectNoFailure(net, kRequests, LossyLinkWorkload(kRequests, 8), "LOSSY+DELAY TP2",
                        {.prefill_tp = 2, .decode_tp = 2, .rank_hosts = {0, 0, 1, 2}});
}

}  // namespace
}  // namespace kvbridge::tools
