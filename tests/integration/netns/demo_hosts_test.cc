// `kvbridge demo --hosts N --json` with the network faults (tools/demo_hosts.h):
// a partition of a prefill or a decode host mid-run (every survivor names
// the cut-off rank as unreachable within 2 s, every page that arrived is
// verified) and a lossy, slow link for the whole run (nothing fails).
//
// The layout is reduced (as in demo_test.cc) and the requests small: across
// hosts, requests of megabytes fail live peers today (issue 13's bulk-data
// false failures, fixed in the connector separately). The lossy-link run has
// tensor-parallel siblings on both sides, so registry liveness (decode tp0
// judging decode tp1 behind the lossy link) is part of what must not fail.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/integration/netns/hosts_util.h"

namespace kvbridge::tools {
namespace {

using nlohmann::json;

const char* kWorkload =
    " --layers 2 --head-dim 16 --min-tokens 256 --max-tokens 1024 --chunk-tokens 512"
    " --concurrency 8 --timeout 120 --worker-arg=--rate=100";

// Runs the demo; its stdout as JSON (an empty object if it is not one).
json RunDemo(const std::string& flags, int* exit_status) {
  const std::string cmd = std::string(KVB_BIN_DIR) + "/kvbridge demo --json" + kWorkload + flags;
  FILE* f = popen((cmd + " 2>/dev/null").c_str(), "r");
  if (f == nullptr) return json::object();
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  const int status = pclose(f);
  *exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  json j = json::parse(out, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << cmd << "\nstdout is not one JSON object:\n" << out;
  return j.is_discarded() ? json::object() : j;
}

struct PartitionCase {
  const char* name;
  const char* fault;
  const char* victim;
};

void PrintTo(const PartitionCase& c, std::ostream* os) { *os << c.name; }

class DemoPartition : public ::testing::TestWithParam<PartitionCase> {};

TEST_P(DemoPartition, EverySurvivorNamesTheCutOffRankAsUnreachable) {
  KVB_SKIP_WITHOUT_HOSTS();
  const PartitionCase& pc = GetParam();
  int status = -1;
  // The pair not cut off runs on by itself (--rate 100 a rank): with 200
  // requests it finished them all before the cut was detected (about 1 s
  // after it) in every TSan run of session 37, and named nobody; with 400
  // it still has requests in flight then.
  json j = RunDemo(std::string(" --hosts 3 --requests 400 --fault ") + pc.fault, &status);
  EXPECT_EQ(status, 0) << j.dump(2);
  EXPECT_TRUE(j.value("ok", false)) << j["problems"].dump(2);
  EXPECT_EQ(j["data_path"], "tcp");
  EXPECT_EQ(j["corrupt_pages"], 0);
  EXPECT_EQ(j["nonterminal"], 0);
  EXPECT_GT(j["verified_pages"].get<uint64_t>(), 0u);
  EXPECT_GT(j["failed"].get<int>(), 0) << "the partition failed no request";
  ASSERT_TRUE(j.contains("fault")) << j.dump(2);
  const json& f = j["fault"];
  EXPECT_TRUE(f["fired"].get<bool>());
  EXPECT_EQ(f["victim"], pc.victim);
  EXPECT_EQ(f["host"], "kvb-h2");  // the victim's host of its own
  int survivors = 0;
  for (const json& r : j["reports"]) {
    SCOPED_TRACE(r.dump(2));
    // The cut-off rank lives on and reports; it never says "exited".
    EXPECT_NE(r["cause"], "peer_exited");
    if (r["victim"].get<bool>()) continue;
    ++survivors;
    EXPECT_GT(r["succeeded"].get<int>(), 0) << "nothing succeeded before the cut";
    ASSERT_FALSE(r["cause"].is_null()) << r["rank"] << " reported no failure";
    EXPECT_TRUE(r["names_victim"].get<bool>());
    EXPECT_EQ(r["origin"], pc.victim);
    EXPECT_EQ(r["cause"], "peer_unreachable");
    EXPECT_NE(r["message"].get<std::string>().find("host kvb-h2"), std::string::npos);
    ASSERT_FALSE(r["detection_ms"].is_null());
    std::printf("DEMO %s %s detection_ms=%.0f\n", pc.name, r["rank"].get<std::string>().c_str(),
                r["detection_ms"].get<double>());
    EXPECT_GT(r["detection_ms"].get<double>(), 0);
    EXPECT_LE(r["detection_ms"].get<double>(), 2000);
  }
  EXPECT_EQ(survivors, 3);
}

INSTANTIATE_TEST_SUITE_P(
    Cut, DemoPartition,
    ::testing::Values(PartitionCase{"prefill", "partition-prefill@10", "prefill tp1"},
                      PartitionCase{"decode", "partition-decode@10", "decode tp1"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(DemoLossyLink, FivePercentLossAndTwentyMsDelayFailNoRequest) {
  KVB_SKIP_WITHOUT_HOSTS();
  int status = -1;
  constexpr int kRequests = 240;
  json j =
      RunDemo(" --hosts 3 --prefill-tp 2 --decode-tp 2 --requests " + std::to_string(kRequests) +
                  " --fault lossy-link --heartbeat-misses " + std::to_string(kLossyLinkMisses),
              &status);
  EXPECT_EQ(status, 0) << j.dump(2);
  EXPECT_TRUE(j.value("ok", false)) << j["problems"].dump(2);
  EXPECT_EQ(j["requests"], kRequests);
  EXPECT_EQ(j["succeeded"], kRequests);
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["corrupt_pages"], 0);
  EXPECT_GT(j["verified_pages"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["data_path"], "tcp");
  ASSERT_TRUE(j.contains("fault")) << j.dump(2);
  // The last decode rank's host (decode tp0 is on kvb-h1): its traffic
  // crossed the link.
  EXPECT_EQ(j["fault"]["host"], "kvb-h2");
  EXPECT_EQ(j["fault"]["victim"], "link of kvb-h2");
  std::printf("DEMO lossy-link p50_us=%.0f p99_us=%.0f seconds=%.1f\n", j["p50_us"].get<double>(),
              j["p99_us"].get<double>(), j["seconds"].get<double>());
}

// The exit status of the demo with `flags` (its output discarded).
int DemoStatus(const std::string& flags) {
  const std::string cmd = std::string(KVB_BIN_DIR) + "/kvbridge demo" + flags + " >/dev/null 2>&1";
  const int status = system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(DemoNetworkFault, IsAUsageErrorWithoutEnoughHosts) {
  EXPECT_EQ(DemoStatus(" --requests 4 --fault lossy-link"), 2);
  EXPECT_EQ(DemoStatus(" --requests 4 --fault partition-decode"), 2);
  KVB_SKIP_WITHOUT_HOSTS();
  EXPECT_EQ(DemoStatus(" --hosts 2 --requests 4 --fault partition-prefill"), 2)
      << "the victim needs a host of its own";
}

}  // namespace
}  // namespace kvbridge::tools
