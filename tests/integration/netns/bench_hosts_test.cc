// `kvbridge bench requests --path tcp --hosts 2`: requests between a prefill
// worker on kvb-h0 and a decode worker on kvb-h1 over veth, next to the raw
// UCX TCP figure measured between the same two hosts in the same run
// (tools/bench_requests.cc). A small layout and few requests: this checks
// the bench works across hosts and reports where each figure ran, not the
// figures themselves (docs/benchmarks.md has those).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/integration/netns/hosts_util.h"

namespace kvbridge::tools {
namespace {

using nlohmann::json;

// Runs `kvbridge <args>`; what it printed (stdout, and stderr too when
// `with_stderr`) and its exit status.
std::string RunKvbridge(const std::string& args, bool with_stderr, int* exit_status) {
  const std::string cmd =
      std::string(KVB_BIN_DIR) + "/kvbridge " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  const int status = pclose(f);
  *exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

TEST(BenchHostsTest, TcpRequestsAndTheRawReferenceBothCrossTheTwoHosts) {
  KVB_SKIP_WITHOUT_HOSTS();
  constexpr int kRequests = 6, kSmallRequests = 20;
  int status = -1;
  const std::string out = RunKvbridge(
      "bench requests --path tcp --hosts 2 --json --layers 2 --head-dim 16 --requests " +
          std::to_string(kRequests) + " --small-requests " + std::to_string(kSmallRequests) +
          " --raw-bytes 32M --raw-region 32M --timeout 50",
      /*with_stderr=*/false, &status);
  const json j = json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << "stdout is not one JSON object:\n" << out;
  EXPECT_EQ(status, 0) << j.dump(2);
  EXPECT_TRUE(j.value("ok", false)) << j.dump(2);
  EXPECT_EQ(j["path"], "tcp");
  EXPECT_EQ(j["hosts"], 2);
  // Both figures name the two hosts, neither says loopback.
  for (const char* key : {"requests_where", "raw_where"}) {
    SCOPED_TRACE(key);
    ASSERT_TRUE(j[key].is_string()) << j.dump(2);
    EXPECT_EQ(j[key], "hosts kvb-h0 -> kvb-h1 over veth");
  }
  EXPECT_FALSE(j.contains("raw_error")) << j["raw_error"];
  EXPECT_GT(j["raw_transport_gbps"].get<double>(), 0);
  // The raw reference also wrote the requests' pieces (a page of one layer:
  // 16 tokens x 8 heads x 16 x 2 B) across the same hosts.
  EXPECT_EQ(j["raw_transport_piece_bytes"], 16 * 8 * 16 * 2) << j.dump(2);
  EXPECT_GT(j["raw_transport_piece_gbps"].get<double>(), 0) << j.dump(2);
  ASSERT_EQ(j["results"].size(), 2u) << j.dump(2);
  for (const json& r : j["results"]) {
    SCOPED_TRACE(r.dump(2));
    EXPECT_FALSE(r.contains("error"));
    EXPECT_EQ(r["failed"], 0);
    EXPECT_EQ(r["succeeded"], r["requests"]);
    EXPECT_GT(r["bytes"].get<uint64_t>(), 0u);
    EXPECT_GT(r["gbps"].get<double>(), 0);
    EXPECT_EQ(r["corrupt_pages"], 0);
    EXPECT_GT(r["verified_pages"].get<uint64_t>(), 0u);
  }
  EXPECT_EQ(j["results"][0]["succeeded"], kRequests);
  EXPECT_EQ(j["results"][1]["succeeded"], kSmallRequests);
  // The ratio is the sweep's figure over the raw one.
  const double gbps = j["results"][0]["gbps"].get<double>();
  EXPECT_NEAR(j["ratio_to_raw"].get<double>(), gbps / j["raw_transport_gbps"].get<double>(), 1e-9);
  std::printf("BENCH hosts 4096-token %.2f GB/s raw %.2f GB/s ratio %.2f\n", gbps,
              j["raw_transport_gbps"].get<double>(), j["ratio_to_raw"].get<double>());
}

// Shared memory cannot cross hosts: a usage error that says so, before any
// host is made (so it needs no root).
TEST(BenchHostsTest, ShmAcrossHostsIsAUsageError) {
  int status = -1;
  const std::string out = RunKvbridge("bench requests --path shm --hosts 2 --requests 1",
                                      /*with_stderr=*/true, &status);
  EXPECT_EQ(status, 2) << out;
  EXPECT_NE(out.find("--hosts needs --path tcp"), std::string::npos) << out;
  EXPECT_NE(out.find("shared memory cannot cross hosts"), std::string::npos) << out;
  EXPECT_EQ(out.find("[bench]"), std::string::npos) << "it started measuring:\n" << out;
}

}  // namespace
}  // namespace kvbridge::tools
