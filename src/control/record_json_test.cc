#include "control/record_json.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>

namespace kvbridge::internal {
namespace {

using nlohmann::json;

json ValidRecord() {
  FailureRecord r;
  r.room = 42;
  r.generation = 7;
  r.origin.role = Role::kPrefill;
  r.origin.tp = 1;
  r.origin.host = "node-a";
  r.origin.pid = 1234;
  r.origin.incarnation = 99;
  r.cause = FailureCause::kPeerExited;
  r.detail = "SIGKILL";
  r.phase = Phase::kTransferring;
  r.detected_by.role = Role::kDecode;
  r.mechanism = "heartbeat";
  r.detected_at = std::chrono::system_clock::time_point(std::chrono::seconds(1'700'000'000));
  r.hint = "restart it";
  return FailureRecordToJson(r);
}

TEST(RecordJsonTest, ARecordReadsBackAsWritten) {
  Result<FailureRecord> r = FailureRecordFromJson(ValidRecord());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(FailureRecordToJson(*r), ValidRecord());
  EXPECT_EQ(r->origin.pid, 1234);
  EXPECT_EQ(r->cause, FailureCause::kPeerExited);
}

struct HostileCase {
  const char* name;
  std::function<void(json&)> mutate;
  const char* field;  // named in the error
};

class RecordJsonHostileTest : public ::testing::TestWithParam<HostileCase> {};

// Each of these once reached a rank's registry thread through a posted
// record, and nlohmann's value() threw there, killing the process.
TEST_P(RecordJsonHostileTest, IsRefusedNamingTheFieldWithoutThrowing) {
  json j = ValidRecord();
  GetParam().mutate(j);
  Result<FailureRecord> r(InternalError("not run"));
  EXPECT_NO_THROW(r = FailureRecordFromJson(j));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(GetParam().field), std::string::npos)
      << r.status().ToString();
}

const std::string kHuge(kMaxRecordTextBytes + 1, 'x');

INSTANTIATE_TEST_SUITE_P(
    Fields, RecordJsonHostileTest,
    ::testing::Values(
        HostileCase{"NumericCause", [](json& j) { j["cause"] = 5; }, "'cause'"},
        HostileCase{"UnknownCause", [](json& j) { j["cause"] = "gremlins"; }, "'cause'"},
        HostileCase{"NoCause", [](json& j) { j.erase("cause"); }, "'cause'"},
        HostileCase{"NoOrigin", [](json& j) { j.erase("origin"); }, "'origin'"},
        HostileCase{"OriginNotObject", [](json& j) { j["origin"] = "prefill"; }, "'origin'"},
        HostileCase{"StringTp", [](json& j) { j["origin"]["tp"] = "1"; }, "'tp'"},
        HostileCase{"NegativeDp", [](json& j) { j["origin"]["dp"] = -1; }, "'dp'"},
        HostileCase{"HugePid", [](json& j) { j["origin"]["pid"] = int64_t{1} << 40; }, "'pid'"},
        HostileCase{"UnknownRole", [](json& j) { j["origin"]["role"] = "root"; }, "'role'"},
        HostileCase{"NegativeRoom", [](json& j) { j["room"] = -3; }, "'room'"},
        HostileCase{"FloatGeneration", [](json& j) { j["generation"] = 1.5; }, "'generation'"},
        HostileCase{"ArrayDetail", [](json& j) { j["detail"] = json::array({1}); }, "'detail'"},
        HostileCase{"HugeDetail", [](json& j) { j["detail"] = kHuge; }, "'detail'"},
        HostileCase{"HugeHint", [](json& j) { j["hint"] = kHuge; }, "'hint'"},
        HostileCase{"HugeHost", [](json& j) { j["origin"]["host"] = kHuge; }, "'host'"},
        HostileCase{"NumericPhase", [](json& j) { j["phase"] = 3; }, "'phase'"},
        HostileCase{"UnknownPhase", [](json& j) { j["phase"] = "teatime"; }, "'phase'"},
        HostileCase{"StringFlag", [](json& j) { j["is_from_another_rank"] = "yes"; },
                    "'is_from_another_rank'"},
        // Microseconds past what the clock's nanoseconds hold overflowed in
        // the conversion (UBSan).
        HostileCase{"TimestampPastTheClock",
                    [](json& j) { j["detected_at_us"] = std::numeric_limits<int64_t>::max(); },
                    "'detected_at_us'"},
        HostileCase{"NegativeTimestamp", [](json& j) { j["last_sign_of_life_us"] = -1; },
                    "'last_sign_of_life_us'"},
        HostileCase{"DetectedByNotObject", [](json& j) { j["detected_by"] = 1; }, "'detected_by'"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(RecordJsonTest, NotAnObjectIsRefused) {
  for (const json& j : {json(), json::array(), json(3), json("record")}) {
    Result<FailureRecord> r = FailureRecordFromJson(j);
    ASSERT_FALSE(r.ok()) << j.dump();
    EXPECT_NE(r.status().message().find("object"), std::string::npos) << r.status().ToString();
  }
}

}  // namespace
}  // namespace kvbridge::internal
