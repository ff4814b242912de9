// `kvbridge bench transport --json` runs end to end (two real processes per
// path) on a small region and prints one JSON object with the documented
// fields; every result is verified at the target.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tests/integration/subprocess_util.h"

namespace {

using kvbridge::testing::CommandOutput;
using kvbridge::testing::RunCommand;

TEST(BenchTransport, JsonHasEveryPathAndSizeVerified) {
  const std::string cmd = std::string(KVB_BIN_DIR) +
                          "/kvbridge bench transport --json --paths shm,cma,tcp "
                          "--block-sizes 4K,1M --bytes 4M --region-size 16M";
  CommandOutput r = RunCommand(cmd);
  ASSERT_EQ(r.exit_status, 0) << cmd << "\n" << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << "stdout is not one JSON object:\n" << r.out;
  ASSERT_TRUE(j.contains("results"));
  const auto& results = j["results"];
  ASSERT_EQ(results.size(), 6u);  // 3 paths x 2 block sizes
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
}

TEST(BenchTransport, UnknownPathIsRejected) {
  CommandOutput r =
      RunCommand(std::string(KVB_BIN_DIR) + "/kvbridge bench transport --paths nosuch 2>/dev/null");
  EXPECT_EQ(r.exit_status, 2);
}

}  // namespace
