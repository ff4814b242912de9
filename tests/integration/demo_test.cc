// `kvbridge demo --json` end to end: a plain run checked field by field, and
// every --fault kind with the reports of the surviving ranks checked to name
// the victim, with its cause and a detection time.
//
// The runs use a reduced layout (4 layers, 64-dim heads) to stay short; the
// process layout (bootstrap + prefill tp 2 + decode tp 2) is the demo's.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/integration/subprocess_util.h"
#include "tools/demo_summary.h"

namespace {

using nlohmann::json;

using kvbridge::testing::CommandOutput;
using kvbridge::testing::RunCommand;

const char* kSmall =
    " --layers 4 --head-dim 64 --min-tokens 16 --max-tokens 1024"
    " --chunk-tokens 256 --concurrency 6 --timeout 90";

json RunDemo(const std::string& flags, int* exit_status) {
  std::string cmd = std::string(KVB_BIN_DIR) + "/kvbridge demo --json" + kSmall + flags;
  CommandOutput r = RunCommand(cmd);
  *exit_status = r.exit_status;
  json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << cmd << "\nstdout is not one JSON object:\n" << r.out;
  return j.is_discarded() ? json::object() : j;
}

TEST(Demo, JsonSummaryFieldByField) {
  int status = -1;
  json j = RunDemo(" --requests 40", &status);
  EXPECT_EQ(status, 0) << j.dump(2);
  for (const char* field : {"requests", "succeeded", "failed", "bytes", "gbps", "p50_us", "p99_us",
                            "verified_pages", "corrupt_pages", "data_path", "ok", "problems"})
    ASSERT_TRUE(j.contains(field)) << field << " missing in " << j.dump(2);
  EXPECT_EQ(j["requests"], 40);
  EXPECT_EQ(j["succeeded"], 40);
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["nonterminal"], 0);
  EXPECT_GT(j["bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(j["gbps"].get<double>(), 0);
  EXPECT_GT(j["p50_us"].get<double>(), 0);
  EXPECT_GE(j["p99_us"].get<double>(), j["p50_us"].get<double>());
  EXPECT_GT(j["verified_pages"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["corrupt_pages"], 0);
  EXPECT_NE(j["data_path"], "unknown");
  EXPECT_EQ(j["prefill_tp"], 2);
  EXPECT_EQ(j["decode_tp"], 2);
  EXPECT_TRUE(j["ok"].get<bool>()) << j["problems"].dump();
  EXPECT_FALSE(j.contains("fault"));
  // bootstrap + 2 prefill + 2 decode processes, all ended cleanly.
  ASSERT_EQ(j["ranks"].size(), 5u);
  for (const json& r : j["ranks"]) EXPECT_EQ(r["exit"], "exit 0") << r.dump();
}

// The README's first command, for a user who set no secret: the demo makes
// one for the processes it starts and every request succeeds.
TEST(Demo, RunsForAUserWhoSetNoToken) {
  const std::string cmd =
      "env -u KVBRIDGE_AUTH_TOKEN -u SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN " +
      std::string(KVB_BIN_DIR) + "/kvbridge demo --json" + kSmall + " --requests 8";
  CommandOutput r = RunCommand(cmd);
  EXPECT_EQ(r.exit_status, 0) << r.out;
  json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j.value("succeeded", -1), 8) << j.dump(2);
  EXPECT_TRUE(j.value("ok", false)) << j.dump(2);
}

struct FaultCase {
  const char* name;
  const char* flag;
  const char* victim;
  const char* cause;  // what survivors must name ("" = any attributed cause)
};

void PrintTo(const FaultCase& c, std::ostream* os) { *os << c.name; }

class DemoFault : public ::testing::TestWithParam<FaultCase> {};

TEST_P(DemoFault, EverySurvivorNamesTheVictim) {
  const FaultCase& fc = GetParam();
  int status = -1;
  // Enough requests that traffic goes on for a few detection windows after
  // the fault: every survivor has time to learn of it.
  // Paced (100 requests/s) so a sibling that shares no request with the
  // victim is still working when the failure reaches it.
  json j =
      RunDemo(std::string(" --requests 200 --worker-arg=--rate=100 --fault ") + fc.flag, &status);
  // The problems first: a CI log keeps a failure's head and tail only.
  EXPECT_EQ(status, 0) << "problems: " << j.value("problems", json::array()).dump(2) << "\n"
                       << j.dump(2);
  EXPECT_TRUE(j.value("ok", false)) << j["problems"].dump(2);
  ASSERT_TRUE(j.contains("fault")) << j.dump(2);
  const json& f = j["fault"];
  EXPECT_TRUE(f["fired"].get<bool>());
  EXPECT_EQ(f["victim"], fc.victim);
  EXPECT_GT(f["pid"].get<int>(), 0);
  EXPECT_EQ(j["corrupt_pages"], 0);
  EXPECT_EQ(j["nonterminal"], 0);
  EXPECT_GT(j["failed"].get<int>(), 0) << "the fault failed no request";
  ASSERT_TRUE(j.contains("reports"));
  int survivors = 0;
  for (const json& r : j["reports"]) {
    if (r["victim"].get<bool>()) continue;
    ++survivors;
    SCOPED_TRACE(r.dump(2));
    ASSERT_FALSE(r["cause"].is_null()) << r["rank"] << " reported no failure";
    EXPECT_TRUE(r["names_victim"].get<bool>());
    if (std::string(fc.victim) != "bootstrap") {
      EXPECT_EQ(r["origin"], fc.victim);
      EXPECT_EQ(r["origin_pid"], f["pid"]);
    }
    if (*fc.cause) {
      EXPECT_EQ(r["cause"], fc.cause);
    }
    for (const char* field : {"phase", "hint", "message"}) {
      EXPECT_TRUE(r[field].is_string() && !r[field].get<std::string>().empty()) << field;
    }
    ASSERT_FALSE(r["detection_ms"].is_null());
    EXPECT_GE(r["detection_ms"].get<double>(), 0);
    EXPECT_LT(r["detection_ms"].get<double>(), 10000);  // generous: loaded 2-core box
  }
  // Four ranks; all but the victim report (the bootstrap is not a rank).
  EXPECT_EQ(survivors, std::string(fc.victim) == "bootstrap" ? 4 : 3);
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, DemoFault,
    ::testing::Values(
        FaultCase{"kill_prefill", "kill-prefill@10", "prefill tp1", "peer_exited"},
        FaultCase{"kill_decode", "kill-decode@10", "decode tp1", "peer_exited"},
        FaultCase{"stop_prefill", "stop-prefill@10", "prefill tp1", "peer_unresponsive"},
        FaultCase{"kill_bootstrap", "kill-bootstrap@10", "bootstrap", "registry_lost"},
        FaultCase{"oom", "oom@10", "prefill tp1", "local_error"}),
    [](const auto& info) { return std::string(info.param.name); });

// A rank that ends badly is quoted in the summary's problems: a CI log keeps
// that line, and a sanitizer's report there names the defect (its first
// lines: the kind and the stack), where the log's last line would only
// count leaked bytes.
TEST(DemoSummary, AnAbnormalEndQuotesTheSanitizersReportOrTheLogsLastLines) {
  char tmpl[] = "/tmp/kvb-excerpt-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  {
    std::ofstream log(dir + "/decode-tp1.log");
    log << "I room 1 done\n==7==ERROR: LeakSanitizer: detected memory leaks\n\n"
        << "Direct leak of 48 byte(s) in 1 object(s) allocated from:\n";
    for (int i = 0; i < 30; ++i) log << "    #" << i << " frame" << i << "\n";
    log << "SUMMARY: AddressSanitizer: 48 byte(s) leaked in 1 allocation(s).\n";
    std::ofstream other(dir + "/prefill-tp0.log");
    other << "one\ntwo\nthree\nfour\n";
    // Not UTF-8: a lone continuation byte and a cut two-byte character.
    std::ofstream raw(dir + "/decode-tp0.log");
    raw << "host caf\xc3\xa9\nbad \x80 byte\tand tab\ncut \xc3";
  }
  const std::string leak = kvbridge::tools::LogExcerpt(dir, "decode tp1");
  EXPECT_EQ(leak.find("I room 1"), std::string::npos) << leak;
  EXPECT_EQ(leak.rfind("==7==ERROR: LeakSanitizer: detected memory leaks | ", 0), 0u) << leak;
  EXPECT_NE(leak.find("#0 frame0"), std::string::npos) << leak;
  EXPECT_NE(leak.find("#16 frame16"), std::string::npos) << leak;
  EXPECT_EQ(leak.find("#17 frame17"), std::string::npos) << "20 lines from the report: " << leak;
  EXPECT_EQ(kvbridge::tools::LogExcerpt(dir, "prefill tp0"), "two | three | four");
  const std::string raw = kvbridge::tools::LogExcerpt(dir, "decode tp0");
  EXPECT_EQ(raw, "host caf?? | bad ? byte?and tab | cut ?");
  const json summary = {{"problem", raw}};
  EXPECT_NO_THROW((void)summary.dump()) << "the summary is JSON";
  EXPECT_EQ(kvbridge::tools::LogExcerpt(dir, "decode tp2"), "") << "no log: nothing quoted";
  std::filesystem::remove_all(dir);
}

TEST(Demo, BadFaultIsAUsageError) {
  CommandOutput r =
      RunCommand(std::string(KVB_BIN_DIR) + "/kvbridge demo --fault melt-gpu 2>/dev/null");
  EXPECT_EQ(r.exit_status, 2);
  r = RunCommand(std::string(KVB_BIN_DIR) + "/kvbridge demo --fault kill-decode@soon 2>/dev/null");
  EXPECT_EQ(r.exit_status, 2);
}

}  // namespace
