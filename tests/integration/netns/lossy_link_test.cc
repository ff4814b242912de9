// A lossy link between hosts: 5% of host 1's packets dropped at random both
// ways (nftables numgen). No request may fail for it: TCP retransmits, and
// liveness must not take a lossy link for a dead peer. (The 20 ms
// delay is not applied: this kernel has no netem; see docs/transport.md.)
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/integration/netns/hosts_util.h"

namespace kvbridge::tools {
namespace {

using std::chrono::milliseconds;

TEST(LossyLinkTest, FivePercentLossFailsNoRequest) {
  KVB_SKIP_WITHOUT_HOSTS();
  auto created = HostNet::Create(3);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  HostNet& net = **created;
  ASSERT_TRUE(net.Lossy(1, 5).ok());
  constexpr int kRequests = 240;
  const std::string logs = NewLogDir();
  auto started = StartCluster(net, {.prefill_tp = 1, .decode_tp = 1, .rank_hosts = {1, 2}}, 0,
                              HostWorkload(kRequests, 8), logs);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  Cluster& c = **started;
  Status s = c.CollectReports(milliseconds(180000));
  ASSERT_TRUE(s.ok()) << s.ToString() << " (logs in " << logs << ")";
  for (int i = 0; i < c.num_ranks(); ++i) {
    const ProcessInfo& p = c.process(i);
    SCOPED_TRACE(p.name);
    ASSERT_TRUE(p.report.has_value()) << p.exit.ToString();
    const auto& r = *p.report;
    EXPECT_EQ(r["succeeded"].get<int>(), kRequests) << r["failures"].dump();
    EXPECT_EQ(r["failed"].get<int>(), 0);
    EXPECT_EQ(r["corrupt_pages"].get<int>(), 0);
    if (p.role == Role::kDecode) {
      EXPECT_GT(r["verified_pages"].get<uint64_t>(), 0u);
    }
    std::printf("LOSSY %s succeeded=%d p50_us=%.0f p99_us=%.0f\n", p.name.c_str(),
                r["succeeded"].get<int>(), r["p50_us"].get<double>(), r["p99_us"].get<double>());
  }
  c.Shutdown(milliseconds(10000));
}

}  // namespace
}  // namespace kvbridge::tools
