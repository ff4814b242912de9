// `kvbridge bench transport --json` runs end to end (two real processes per
// path) on a small region and prints one JSON object with the documented
// fields; every result is verified at the target.
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "tests/integration/subprocess_util.h"
#include "tools/cpu_sides.h"

namespace {

using kvbridge::testing::CommandOutput;
using kvbridge::testing::RunCommand;

TEST(BenchTransport, JsonHasEveryPathAndSizeVerified) {
  const std::string cmd = std::string(KVB_BIN_DIR) +
                          "/kvbridge bench transport --json --paths shm,cma,tcp,tcp-granted "
                          "--block-sizes 4K,1M --bytes 4M --region-size 16M";
  CommandOutput r = RunCommand(cmd);
  ASSERT_EQ(r.exit_status, 0) << cmd << "\n" << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << "stdout is not one JSON object:\n" << r.out;
  ASSERT_TRUE(j.contains("results"));
  const auto& results = j["results"];
  ASSERT_EQ(results.size(), 8u);  // 4 paths x 2 block sizes
  for (const auto& row : results) {
    for (const char* field : {"path", "bytes", "gbps", "msg_rate", "reference_gbps", "ratio",
                              "block_size", "chosen_path", "verified"}) {
      EXPECT_TRUE(row.contains(field)) << field << " missing in " << row.dump();
    }
    EXPECT_TRUE(row["verified"].get<bool>()) << row.dump();
    EXPECT_TRUE(row["error"].is_null()) << row.dump();
    EXPECT_GT(row["gbps"].get<double>(), 0) << row.dump();
    EXPECT_GT(row["reference_gbps"].get<double>(), 0) << row.dump();
    EXPECT_EQ(row["bytes"].get<uint64_t>(), 4u << 20) << row.dump();
  }
  EXPECT_EQ(results[0]["path"], "shm");
  EXPECT_EQ(results[2]["path"], "cma");
  EXPECT_EQ(results[4]["path"], "tcp");
  // Writes under a per-peer grant's key, which carries no rkey: every block
  // an active message the target admitted, and verified there.
  EXPECT_EQ(results[6]["path"], "tcp-granted");
}

// `bench requests --json` says in what runs the engine copies a request
// (one token's head slice when the two sides' tp sizes differ, a whole page
// when they hold the same heads) and prints memcpy of those runs at their
// offsets in the pages beside the requests' rate.
TEST(BenchRequests, JsonGivesTheRunSizeAndMemcpyInRunsOfIt) {
  constexpr int kHeads = 4, kHeadBytes = 16 * 2, kPageSize = 4;  // --head-dim 16, 2-byte dtype
  struct Case {
    int prefill_tp, decode_tp;
    int run_bytes;  // what engine/plan.h's rule gives for decode rank 0
  };
  for (const Case& c : {Case{1, 1, kPageSize * kHeads * kHeadBytes},  // whole page, 4 heads
                        Case{1, 2, 2 * kHeadBytes},                   // decode's 2 heads per token
                        Case{2, 1, 2 * kHeadBytes},                   // prefill's 2 heads per token
                        Case{2, 4, 1 * kHeadBytes}}) {
    SCOPED_TRACE(std::to_string(c.prefill_tp) + " -> " + std::to_string(c.decode_tp));
    const std::string cmd =
        std::string(KVB_BIN_DIR) + "/kvbridge bench requests --json --no-raw --layers 2 --heads " +
        std::to_string(kHeads) + " --head-dim 16 --page-size " + std::to_string(kPageSize) +
        " --tokens 64 --requests 2 --small-requests 4 --prefill-tp " +
        std::to_string(c.prefill_tp) + " --decode-tp " + std::to_string(c.decode_tp) +
        " 2>/dev/null";
    CommandOutput r = RunCommand(cmd);
    ASSERT_EQ(r.exit_status, 0) << cmd << "\n" << r.out;
    const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(j.is_discarded()) << "stdout is not one JSON object:\n" << r.out;
    EXPECT_TRUE(j.value("ok", false)) << j.dump(2);
    // The page piece of the existing reference: one page of decode rank 0's heads.
    EXPECT_EQ(j["memcpy_piece_bytes"], kPageSize * (kHeads / c.decode_tp) * kHeadBytes);
    EXPECT_EQ(j["run_bytes"], c.run_bytes) << j.dump(2);
    EXPECT_GT(j["memcpy_runs_gbps"].get<double>(), 0) << j.dump(2);
    EXPECT_GT(j["ratio_to_memcpy_runs"].get<double>(), 0) << j.dump(2);
    if (c.prefill_tp == c.decode_tp) {
      EXPECT_EQ(j["memcpy_runs_gbps"], j["memcpy_gbps"]);  // the same pieces: measured once
    }
  }
}

// `bench requests --check-outside-window`: the bandwidth sweep's pattern is
// filled before and checked after its measured window, and still on every
// page of every request: the warm-up ones checked as they finish, the
// measured ones held and checked at the end. A measured request whose
// pages were never checked would leave verified_pages short.
TEST(BenchRequests, CheckingOutsideTheWindowStillChecksEveryPageOfEveryRequest) {
  constexpr int kLayers = 2, kTokens = 64, kPageSize = 4, kRequests = 3;
  const std::string cmd =
      std::string(KVB_BIN_DIR) +
      "/kvbridge bench requests --json --no-raw --check-outside-window --layers " +
      std::to_string(kLayers) + " --heads 4 --head-dim 16 --page-size " +
      std::to_string(kPageSize) + " --tokens " + std::to_string(kTokens) + " --requests " +
      std::to_string(kRequests) + " --small-requests 4 2>/dev/null";
  CommandOutput r = RunCommand(cmd);
  ASSERT_EQ(r.exit_status, 0) << cmd << "\n" << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << "stdout is not one JSON object:\n" << r.out;
  EXPECT_TRUE(j.value("ok", false)) << j.dump(2);
  EXPECT_EQ(j["check_outside_window"], true);
  const nlohmann::json& big = j["results"][0];
  EXPECT_EQ(big["succeeded"], kRequests) << big.dump();
  EXPECT_EQ(big["corrupt_pages"], 0) << big.dump();
  const int warmup = big["warmup_requests"].get<int>();
  EXPECT_GE(warmup, 2) << big.dump();  // at least the requests in flight
  // Every page of every request, in each of the 2 x layers (K and V) buffers.
  const int pages_per_request = kTokens / kPageSize;
  EXPECT_EQ(big["verified_pages"], (kRequests + warmup) * pages_per_request * 2 * kLayers)
      << big.dump();
  EXPECT_GT(big["gbps"].get<double>(), 0) << big.dump();
}

// `bench requests --rounds 3`: three rounds of (raw transport, bandwidth
// sweep), each round's pair of figures in the JSON in order, every page of
// every round verified, and the report's figures the rounds' lower medians
// (computed here from the rounds' own figures). Out-of-range counts are
// refused by name. The raw region holds every byte written: with a smaller
// one the raw bench wraps around and writes the same target bytes twice in
// one batch, which the transport's writer threads copy at once (transport.h:
// overlapping ops leave those bytes unspecified); under ThreadSanitizer that
// is a data race report, which stalled the writes past the bench's 30 s
// deadline. Each round also measures the raw transport writing pieces the
// size of the requests' writes (a page of one layer: 4 tokens x 4 heads x
// 128 x 2 B), in the same processes.
TEST(BenchRequests, RoundsGiveEachRoundAndTheReportTakesTheirMedians) {
  constexpr int kRounds = 3;
  const std::string cmd = std::string(KVB_BIN_DIR) + "/kvbridge bench requests --json --rounds " +
                          std::to_string(kRounds) +
                          " --raw-bytes 16M --raw-region 16M --layers 2 --heads 4 --head-dim 128 "
                          "--page-size 4 --tokens 64 --requests 2 --small-requests 4 --step-us 200 "
                          "2>/dev/null";
  CommandOutput r = RunCommand(cmd);
  ASSERT_EQ(r.exit_status, 0) << cmd << "\n" << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << "stdout is not one JSON object:\n" << r.out;
  EXPECT_TRUE(j.value("ok", false)) << j.dump(2);
  ASSERT_TRUE(j["rounds"].is_array()) << j.dump(2);
  ASSERT_EQ(j["rounds"].size(), static_cast<size_t>(kRounds)) << j.dump(2);
  EXPECT_EQ(j["step_us"], 200) << j.dump(2);
  EXPECT_EQ(j["raw_transport_piece_bytes"], 4 * 4 * 128 * 2) << j.dump(2);
  std::vector<double> raws, gbps, pieces;
  for (const nlohmann::json& round : j["rounds"]) {
    EXPECT_GT(round["raw_transport_gbps"].get<double>(), 0) << round.dump();
    EXPECT_GT(round["raw_transport_piece_gbps"].get<double>(), 0) << round.dump();
    pieces.push_back(round["raw_transport_piece_gbps"].get<double>());
    EXPECT_DOUBLE_EQ(round["ratio_to_raw_piece"].get<double>(),
                     round["gbps"].get<double>() / pieces.back())
        << round.dump();
    EXPECT_GT(round["gbps"].get<double>(), 0) << round.dump();
    EXPECT_GT(round["verified_pages"].get<uint64_t>(), 0u) << round.dump();
    EXPECT_EQ(round["corrupt_pages"], 0) << round.dump();
    raws.push_back(round["raw_transport_gbps"].get<double>());
    gbps.push_back(round["gbps"].get<double>());
  }
  std::sort(raws.begin(), raws.end());
  std::sort(gbps.begin(), gbps.end());
  std::sort(pieces.begin(), pieces.end());
  EXPECT_DOUBLE_EQ(j["raw_transport_piece_gbps"].get<double>(), pieces[1]) << j.dump(2);
  EXPECT_DOUBLE_EQ(j["ratio_to_raw_piece"].get<double>(), gbps[1] / pieces[1]) << j.dump(2);
  EXPECT_DOUBLE_EQ(j["raw_transport_gbps"].get<double>(), raws[1]) << j.dump(2);
  EXPECT_DOUBLE_EQ(j["results"][0]["gbps"].get<double>(), gbps[1]) << j.dump(2);
  EXPECT_DOUBLE_EQ(j["ratio_to_raw"].get<double>(), gbps[1] / raws[1]) << j.dump(2);

  for (const char* bad : {"0", "10"}) {
    CommandOutput refused =
        RunCommand(std::string(KVB_BIN_DIR) + "/kvbridge bench requests --rounds " + bad + " 2>&1");
    EXPECT_NE(refused.exit_status, 0) << bad;
    EXPECT_NE(refused.out.find("--rounds"), std::string::npos) << refused.out;
  }
}

// The CPUs this test may run on, read here (not through cpu_sides.h).
std::set<int> TestCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::set<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.insert(c);
  return cpus;
}

TEST(CpuSides, SplitsTheCpusInALowerAndAnUpperHalf) {
  using kvbridge::tools::SplitCpus;
  auto two = SplitCpus({1, 0});
  ASSERT_TRUE(two.has_value());
  EXPECT_EQ(two->first, "0");
  EXPECT_EQ(two->second, "1");
  auto odd = SplitCpus({5, 2, 3, 1, 0});  // the larger half to the receiving side
  ASSERT_TRUE(odd.has_value());
  EXPECT_EQ(odd->first, "0,1");
  EXPECT_EQ(odd->second, "2,3,5");
  auto dups = SplitCpus({4, 4, 6, 6});
  ASSERT_TRUE(dups.has_value());
  EXPECT_EQ(dups->first, "4");
  EXPECT_EQ(dups->second, "6");
  EXPECT_FALSE(SplitCpus({}).has_value());
  EXPECT_FALSE(SplitCpus({3}).has_value());
  EXPECT_FALSE(SplitCpus({3, 3}).has_value());  // one CPU, twice
  EXPECT_FALSE(SplitCpus({-1, 2}).has_value());
}

// `bench requests` runs prefill's workers on the lower half of its CPUs and
// decode's on the upper half (each worker reports the CPUs it may run on),
// and with --no-pin leaves them all to the scheduler.
TEST(BenchRequests, EachSideRunsOnItsOwnHalfOfTheCpusUnlessToldNotTo) {
  const std::set<int> cpus = TestCpus();
  if (cpus.size() < 2) GTEST_SKIP() << "one CPU: no halves to pin the sides to";
  for (const bool pin : {true, false}) {
    SCOPED_TRACE(pin ? "pinned" : "--no-pin");
    const std::string cmd = std::string(KVB_BIN_DIR) +
                            "/kvbridge bench requests --json --no-raw --layers 2 --heads 4 "
                            "--head-dim 16 --page-size 4 --tokens 64 --requests 2 "
                            "--small-requests 4 --decode-tp 2" +
                            (pin ? "" : " --no-pin") + " 2>/dev/null";
    CommandOutput r = RunCommand(cmd);
    ASSERT_EQ(r.exit_status, 0) << cmd << "\n" << r.out;
    const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(j.is_discarded()) << "stdout is not one JSON object:\n" << r.out;
    EXPECT_TRUE(j.value("ok", false)) << j.dump(2);
    for (const nlohmann::json& sweep : j["results"]) {
      const auto prefill = sweep["prefill_cpus"].get<std::set<int>>();
      const auto decode = sweep["decode_cpus"].get<std::set<int>>();
      if (!pin) {
        EXPECT_TRUE(j["cpus"].is_null()) << j.dump(2);
        EXPECT_EQ(prefill, cpus) << sweep.dump();
        EXPECT_EQ(decode, cpus) << sweep.dump();
        continue;
      }
      ASSERT_FALSE(prefill.empty()) << sweep.dump();
      ASSERT_FALSE(decode.empty()) << sweep.dump();
      EXPECT_LT(*prefill.rbegin(), *decode.begin()) << sweep.dump();  // disjoint, lower half first
      std::set<int> both = prefill;
      both.insert(decode.begin(), decode.end());
      EXPECT_EQ(both, cpus) << sweep.dump();
      EXPECT_EQ(prefill.size(), cpus.size() / 2) << sweep.dump();
      EXPECT_TRUE(j["cpus"].is_object()) << j.dump(2);
    }
  }
}

// `bench scale` finishes every request both ways a worker step can poll:
// every room in flight, or only those KVManager::TakeChangedRooms lists (a
// room it failed to list would never finish, and the point would time out).
TEST(BenchScale, EveryRequestSucceedsPollingAllOrOnlyChangedRooms) {
  for (const std::string poll : {"changed", "all"}) {
    SCOPED_TRACE(poll);
    const std::string cmd = std::string(KVB_BIN_DIR) +
                            "/kvbridge bench scale --json --rooms 20,300 --rounds 2 --decode-tp 2 "
                            "--timeout 60 --poll " +
                            poll + " 2>/dev/null";
    CommandOutput r = RunCommand(cmd);
    ASSERT_EQ(r.exit_status, 0) << cmd << "\n" << r.out;
    const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(j.is_discarded()) << "stdout is not one JSON object:\n" << r.out;
    EXPECT_EQ(j["poll"], poll);
    ASSERT_EQ(j["results"].size(), 2u) << j.dump(2);
    for (const auto& point : j["results"]) {
      EXPECT_EQ(point["succeeded"], 2 * point["rooms"].get<int>()) << point.dump();
      EXPECT_EQ(point["failed"], 0) << point.dump();
      EXPECT_FALSE(point.contains("error")) << point.dump();
    }
  }
}

TEST(BenchScale, AnUnknownPollModeIsRefusedByName) {
  CommandOutput r = RunCommand(std::string(KVB_BIN_DIR) +
                               "/kvbridge bench scale --poll everything --rooms 1 2>&1");
  EXPECT_NE(r.exit_status, 0) << r.out;
  EXPECT_NE(r.out.find("--poll"), std::string::npos) << r.out;
}

TEST(BenchTransport, UnknownPathIsRejected) {
  CommandOutput r =
      RunCommand(std::string(KVB_BIN_DIR) + "/kvbridge bench transport --paths nosuch 2>/dev/null");
  EXPECT_EQ(r.exit_status, 2);
}

}  // namespace
