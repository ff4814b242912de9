// Bulk data between two hosts with the library's default liveness (100 ms
// heartbeats, 5 misses): hundreds of multi-MiB requests, unpaced, so the
// TCP connection between the hosts carries hundreds of MiB queued at any
// time. Heartbeats must not be taken for lost behind that data: no request
// may fail and no rank may be declared failed. (The demo's default model,
// up to 256 MiB requests, still fails: docs/protocol.md, "Failure detection
// and propagation".)
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/integration/netns/hosts_util.h"

namespace kvbridge::tools {
namespace {

using std::chrono::milliseconds;

TEST(BulkTest, MultiMiBRequestsAcrossHostsFailNothing) {
  KVB_SKIP_WITHOUT_HOSTS();
  constexpr int kRequests = 240;
  // 8 layers x 8 kv heads x 128 x 2 bytes x (k, v) = 32 KiB per token:
  // 256..1024 tokens make 8..32 MiB per request, 8 at a time.
  const std::vector<std::string> args = {"--layers",
                                         "8",
                                         "--heads",
                                         "8",
                                         "--head-dim",
                                         "128",
                                         "--page-size",
                                         "16",
                                         "--min-tokens",
                                         "256",
                                         "--max-tokens",
                                         "1024",
                                         "--chunk-tokens",
                                         "512",
                                         "--requests",
                                         std::to_string(kRequests),
                                         "--concurrency",
                                         "8",
                                         "--pool-pages",
                                         "640",
                                         "--heartbeat-ms",
                                         "100",
                                         "--heartbeat-misses",
                                         "5",
                                         "--progress-ms",
                                         "200",
                                         "--deadline-s",
                                         "120",
                                         "--check-stride",
                                         "4",
                                         "--shm"};
  HostsCluster hc = StartOnHosts({.prefill_tp = 1, .decode_tp = 1, .rank_hosts = {1, 2}}, args);
  ASSERT_TRUE(hc.cluster) << hc.error;
  Cluster& c = *hc.cluster;
  Status s = c.CollectReports(milliseconds(180000));
  ASSERT_TRUE(s.ok()) << s.ToString() << " (logs in " << hc.log_dir << ")";
  for (int i = 0; i < c.num_ranks(); ++i) {
    const ProcessInfo& p = c.process(i);
    SCOPED_TRACE(p.name + " (logs in " + hc.log_dir + ")");
    ASSERT_TRUE(p.report.has_value()) << p.exit.ToString();
    const auto& r = *p.report;
    EXPECT_EQ(r["succeeded"].get<int>(), kRequests) << r["failures"].dump();
    EXPECT_EQ(r["failed"].get<int>(), 0);
    EXPECT_EQ(r["corrupt_pages"].get<int>(), 0);
    EXPECT_FALSE(r.contains("rank_failure")) << r["rank_failure"].dump();
    if (p.role == Role::kDecode) {
      EXPECT_GT(r["verified_pages"].get<uint64_t>(), 0u);
      const double seconds = r["window_seconds"].get<double>();
      std::printf("BULK %s succeeded=%d bytes=%llu window_s=%.2f GB/s=%.2f p99_us=%.0f\n",
                  p.name.c_str(), r["succeeded"].get<int>(),
                  static_cast<unsigned long long>(r["bytes"].get<uint64_t>()), seconds,
                  seconds > 0 ? r["bytes"].get<uint64_t>() / seconds / 1e9 : 0.0,
                  r["p99_us"].get<double>());
    }
  }
  c.Shutdown(milliseconds(10000));
}

}  // namespace
}  // namespace kvbridge::tools
