#include "control/registry.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "control/registry_test_util.h"

namespace kvbridge::internal::registry_test {
namespace {

TEST(RankRecordTest, JsonRoundTripKeepsEveryField) {
  RankRecord r = Prefill(1, 4, 0xfedcba9876543210ull);
  r.attn_cp_size = 2;
  r.attn_cp_rank = 1;
  r.pp_size = 3;
  r.pp_rank = 2;
  r.instance = "decode-b:8001";
  r.boot_id = "0f3c1d2e-5a6b-4c7d-8e9f-0a1b2c3d4e5f";
  json j = r.ToJson();
  EXPECT_EQ(j["role"], "prefill");
  EXPECT_EQ(j["transport_address"], "AAF1Y3j/");
  Result<RankRecord> back = RankRecord::FromJson(json::parse(j.dump()));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->ToJson(), j);
  EXPECT_EQ(back->transport_address, r.transport_address);
  EXPECT_EQ(back->incarnation, 0xfedcba9876543210ull);
  EXPECT_EQ(back->key(), (RankKey{0, 1, 1, 2}));
  EXPECT_EQ(back->instance, "decode-b:8001");
  EXPECT_EQ(back->boot_id, r.boot_id);
  EXPECT_EQ(back->Describe(),
            "prefill[decode-b:8001] dp0 cp1 tp1 pp2 (host node-a, pid 1001, "
            "incarnation 18364758544493064720)");
}

TEST(RankRecordTest, AcceptsSglangRoleSpellingAndOptionalFields) {
  json j = Prefill(0).ToJson();
  j["role"] = "Prefill";
  j.erase("transport_address");
  j.erase("layout");
  j.erase("boot_id");
  j["system_dp_rank"] = 0;  // unknown fields are ignored
  Result<RankRecord> r = RankRecord::FromJson(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->role, RankRole::kPrefill);
  EXPECT_TRUE(r->transport_address.empty());
  EXPECT_TRUE(r->layout.is_object());
  EXPECT_TRUE(r->boot_id.empty()) << "a rank that does not say its boot id has none";
}

struct BadField {
  std::function<void(json&)> mutate;
  std::string names;  // expected in the message
};

class RankRecordBadFieldTest : public ::testing::TestWithParam<BadField> {};

TEST_P(RankRecordBadFieldTest, IsInvalidArgumentNamingTheField) {
  json j = Prefill(1).ToJson();
  GetParam().mutate(j);
  // Through text, as over HTTP: the parser types 0 as unsigned.
  Result<RankRecord> r = RankRecord::FromJson(json::parse(j.dump()));
  ASSERT_FALSE(r.ok());
  ExpectError(r.status(), StatusCode::kInvalidArgument, GetParam().names);
}

INSTANTIATE_TEST_SUITE_P(
    Fields, RankRecordBadFieldTest,
    ::testing::Values(BadField{[](json& j) { j = json::array(); }, "expected a JSON object"},
                      BadField{[](json& j) { j["role"] = 7; }, "'role'"},
                      BadField{[](json& j) { j["role"] = "router"; }, "role"},
                      BadField{[](json& j) { j["attn_tp_rank"] = "1"; }, "'attn_tp_rank'"},
                      BadField{[](json& j) { j["attn_tp_rank"] = 2; }, "attn_tp_rank = 2"},
                      BadField{[](json& j) { j["attn_tp_size"] = 0; }, "'attn_tp_size'"},
                      BadField{[](json& j) { j["attn_dp_rank"] = -1; }, "'attn_dp_rank'"},
                      BadField{[](json& j) { j["pp_size"] = 1.5; }, "'pp_size'"},
                      BadField{[](json& j) { j.erase("rank_ip"); }, "'rank_ip'"},
                      BadField{[](json& j) { j["rank_ip"] = ""; }, "rank_ip"},
                      BadField{[](json& j) { j["rank_port"] = 70000; }, "'rank_port'"},
                      BadField{[](json& j) { j["page_size"] = 0; }, "'page_size'"},
                      BadField{[](json& j) { j["kv_cache_dtype"] = ""; }, "kv_cache_dtype"},
                      BadField{[](json& j) { j["host"] = 5; }, "'host'"},
                      BadField{[](json& j) { j["pid"] = -1; }, "'pid'"},
                      BadField{[](json& j) { j["boot_id"] = 5; }, "'boot_id'"},
                      BadField{[](json& j) { j["boot_id"] = std::string(65, 'b'); },
                               "boot_id of 65 bytes, more than 64"},
                      BadField{[](json& j) { j["page_size"] = -3; }, "'page_size'"},
                      BadField{[](json& j) { j["incarnation"] = 0; }, "incarnation"},
                      BadField{[](json& j) { j["incarnation"] = -5; }, "'incarnation'"},
                      BadField{[](json& j) { j["transport_address"] = "!!"; }, "transport_address"},
                      BadField{[](json& j) { j["instance"] = "a b"; }, "instance 'a b'"},
                      BadField{[](json& j) { j["instance"] = 3; }, "'instance'"},
                      BadField{[](json& j) { j["layout"] = json::array(); }, "'layout'"},
                      BadField{[](json& j) {
                                 j["attn_tp_size"] = 1024;
                                 j["pp_size"] = 1024;
                               },
                               "exceeds 65536"}));

struct LookupCase {
  std::string name;
  std::vector<RankRecord> registered;
  RankKey query;  // dp, cp, tp, pp
  StatusCode code;
  std::string message_part;  // in the error, or the rank_ip... of the answer
};

class RegistryLookupTest : public RegistryTest, public ::testing::WithParamInterface<LookupCase> {};

TEST_P(RegistryLookupTest, FollowsSglangSemantics) {
  const LookupCase& c = GetParam();
  for (const RankRecord& r : c.registered) ASSERT_TRUE(Reg(r).ok());
  Result<RankRecord> got = registry_->GetRank(c.query.dp, c.query.cp, c.query.tp, c.query.pp);
  if (c.code == StatusCode::kOk) {
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->key(), c.query);
    EXPECT_EQ(got->role, RankRole::kPrefill);
  } else {
    ASSERT_FALSE(got.ok());
    ExpectError(got.status(), c.code, c.message_part);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, RegistryLookupTest,
    ::testing::Values(
        LookupCase{"Empty", {}, {0, 0, 0, 0}, StatusCode::kUnavailable, "no prefill rank"},
        LookupCase{"DecodeOnlyDoesNotCount",
                   {Decode(0, 7), Decode(1, 8)},
                   {0, 0, 0, 0},
                   StatusCode::kUnavailable,
                   "no prefill rank"},
        LookupCase{"Partial",
                   {Prefill(0), Decode(1, 8)},
                   {0, 0, 0, 0},
                   StatusCode::kUnavailable,
                   "1 of 2 prefill ranks registered"},
        LookupCase{"OutsideTp", {Prefill(0)}, {0, 0, 2, 0}, StatusCode::kNotFound, "tp2"},
        LookupCase{"Complete", {Prefill(0), Prefill(1)}, {0, 0, 1, 0}, StatusCode::kOk, ""},
        LookupCase{"OutsideDp",
                   {Prefill(0), Prefill(1)},
                   {1, 0, 0, 0},
                   StatusCode::kNotFound,
                   "attn_dp_size 1"},
        LookupCase{
            "OutsideCp", {Prefill(0), Prefill(1)}, {0, 1, 0, 0}, StatusCode::kNotFound, "cp1"},
        LookupCase{
            "OutsidePp", {Prefill(0), Prefill(1)}, {0, 0, 0, 1}, StatusCode::kNotFound, "pp1"},
        LookupCase{"Negative",
                   {Prefill(0), Prefill(1)},
                   {0, 0, -1, 0},
                   StatusCode::kInvalidArgument,
                   "negative"}),
    [](const auto& info) { return info.param.name; });

TEST_F(RegistryTest, ParallelInfoCountsPrefillRanksOnly) {
  ExpectError(registry_->GetParallelInfo().status(), StatusCode::kUnavailable, "no prefill");
  ASSERT_TRUE(Reg(Decode(0, 9)).ok());
  ASSERT_TRUE(Reg(Prefill(1, 4)).ok());
  // As sglang's server: not served until the instance is whole.
  ExpectError(registry_->GetParallelInfo().status(), StatusCode::kUnavailable,
              "1 of 4 prefill ranks registered");
  for (int tp : {0, 2, 3}) ASSERT_TRUE(Reg(Prefill(tp, 4)).ok());
  Result<ParallelInfo> info = registry_->GetParallelInfo();
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->attn_tp_size, 4);
  EXPECT_EQ(info->attn_cp_size, 1);
  EXPECT_EQ(info->attn_dp_size, 1);
  EXPECT_EQ(info->pp_size, 1);
  EXPECT_EQ(info->page_size, 16);
  EXPECT_EQ(info->kv_cache_dtype, "bfloat16");
  EXPECT_EQ(info->ranks_registered, 4);
  EXPECT_EQ(info->ranks_expected, 4);
  EXPECT_TRUE(info->complete());
  Result<ParallelInfo> back = ParallelInfo::FromJson(info->ToJson());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->ToJson(), info->ToJson());
}

// A registry's answer (sglang's server, or one that is not what it says)
// whose four sizes multiply past 2^63: refused, not wrapped below the rank
// limit into an instance of 0 ranks that counts as complete (review finding,
// session 36).
TEST(ParallelInfoTest, SizesWhoseProductOverflowsAreRefused) {
  nlohmann::json j = {{"attn_tp_size", 65536}, {"attn_cp_size", 65536}, {"dp_size", 65536},
                      {"pp_size", 65536},      {"page_size", 16},       {"kv_cache_dtype", "bf16"}};
  Result<ParallelInfo> got = ParallelInfo::FromJson(j);
  ASSERT_FALSE(got.ok()) << "ranks_expected " << got->ranks_expected;
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(got.status().message().find("exceeds 65536"), std::string::npos)
      << got.status().message();
  j["attn_tp_size"] = j["attn_cp_size"] = j["dp_size"] = j["pp_size"] = 2147483647;
  EXPECT_FALSE(ParallelInfo::FromJson(j).ok());
  j["attn_tp_size"] = 4;
  j["attn_cp_size"] = j["dp_size"] = j["pp_size"] = 1;
  got = ParallelInfo::FromJson(j);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->ranks_expected, 4);
}

struct ConflictCase {
  std::function<void(RankRecord&)> mutate;
  std::string mine_then_theirs[2];
};

class RegistryConflictTest : public RegistryTest,
                             public ::testing::WithParamInterface<ConflictCase> {};

TEST_P(RegistryConflictTest, IsFailedPreconditionNamingBothValues) {
  ASSERT_TRUE(Reg(Prefill(0)).ok());
  RankRecord r = Prefill(1);
  GetParam().mutate(r);
  Status s = Reg(r);
  ExpectError(s, StatusCode::kFailedPrecondition, GetParam().mine_then_theirs[1]);
  ExpectError(s, StatusCode::kFailedPrecondition, GetParam().mine_then_theirs[0]);
  EXPECT_EQ(registry_->ListRanks()->size(), 1u);  // the conflicting rank was not kept
}

INSTANTIATE_TEST_SUITE_P(
    Fields, RegistryConflictTest,
    ::testing::Values(
        ConflictCase{[](RankRecord& r) { r.attn_tp_size = 4; },
                     {"have attn_tp_size 2", "registers attn_tp_size 4"}},
        ConflictCase{[](RankRecord& r) { r.attn_dp_size = 2; },
                     {"have attn_dp_size 1", "registers attn_dp_size 2"}},
        ConflictCase{[](RankRecord& r) { r.pp_size = 2; }, {"have pp_size 1", "pp_size 2"}},
        ConflictCase{[](RankRecord& r) { r.attn_cp_size = 2; },
                     {"have attn_cp_size 1", "attn_cp_size 2"}},
        ConflictCase{[](RankRecord& r) { r.page_size = 64; }, {"page_size 16", "page_size 64"}},
        ConflictCase{[](RankRecord& r) { r.kv_cache_dtype = "fp8_e4m3"; },
                     {"kv_cache_dtype bfloat16", "kv_cache_dtype fp8_e4m3"}}));

TEST_F(RegistryTest, RegisterRejectsInvalidRecord) {
  RankRecord r = Prefill(0);
  r.attn_tp_rank = 5;
  ExpectError(Reg(r), StatusCode::kInvalidArgument, "attn_tp_rank");
}

TEST_F(RegistryTest, NewIncarnationReplacesAndCountsRestart) {
  ASSERT_TRUE(Reg(Prefill(0)).ok());
  ASSERT_TRUE(Reg(Prefill(1)).ok());
  ASSERT_TRUE(Reg(Prefill(1)).ok());  // same process again: no restart
  EXPECT_EQ(StatusAt(RankRole::kPrefill, 1).restarts, 0u);
  ASSERT_TRUE(Reg(Prefill(1, 2, 555)).ok());
  EXPECT_EQ(registry_->GetRank(0, 0, 1, 0)->incarnation, 555u);
  EXPECT_EQ(StatusAt(RankRole::kPrefill, 1).restarts, 1u);
  EXPECT_EQ(registry_->GetParallelInfo()->ranks_registered, 2);
  // The old process is fenced off.
  ExpectError(Beat(RankRole::kPrefill, 0, 0, 1, 0, 101), StatusCode::kFailedPrecondition,
              "held by incarnation 555");
}

struct LivenessCase {
  milliseconds silent;
  Liveness state;
};

class RegistryLivenessTest : public RegistryTest,
                             public ::testing::WithParamInterface<LivenessCase> {};

TEST_P(RegistryLivenessTest, StateFollowsAgeOfLastSignOfLife) {
  ASSERT_TRUE(Reg(Prefill(0)).ok());
  ASSERT_TRUE(Reg(Decode(0, 7)).ok());
  Advance(milliseconds(50000));
  ASSERT_TRUE(Beat(RankRole::kPrefill, 0, 0, 0, 0, 100).ok());
  ASSERT_TRUE(Beat(RankRole::kDecode, 0, 0, 0, 0, 7).ok());
  Advance(GetParam().silent);
  for (RankRole role : {RankRole::kPrefill, RankRole::kDecode}) {
    RankStatus s = StatusAt(role, 0);
    EXPECT_EQ(s.state, GetParam().state) << RankRoleName(role);
    EXPECT_EQ(s.age, GetParam().silent);
  }
}

// Defaults: unresponsive after 1000 ms, dead after 10000 ms.
INSTANTIATE_TEST_SUITE_P(
    Ages, RegistryLivenessTest,
    ::testing::Values(LivenessCase{milliseconds(0), Liveness::kAlive},
                      LivenessCase{milliseconds(1000), Liveness::kAlive},
                      LivenessCase{milliseconds(1001), Liveness::kUnresponsive},
                      LivenessCase{milliseconds(10000), Liveness::kUnresponsive},
                      LivenessCase{milliseconds(10001), Liveness::kDead}));

TEST_F(RegistryTest, HeartbeatErrors) {
  ASSERT_TRUE(Reg(Prefill(0)).ok());
  ASSERT_TRUE(Reg(Decode(1, 7)).ok());
  ExpectError(Beat(RankRole::kPrefill, 0, 0, 1, 0, 101), StatusCode::kNotFound,
              "unregistered prefill rank dp0 cp0 tp1 pp0");
  ExpectError(Beat(RankRole::kDecode, 0, 0, 1, 0, 8), StatusCode::kNotFound, "incarnation 8");
  ExpectError(Beat(RankRole::kPrefill, 0, 0, 0, 0, 999), StatusCode::kFailedPrecondition,
              "incarnation 100");
  EXPECT_TRUE(Beat(RankRole::kDecode, 0, 0, 1, 0, 7).ok());
}

TEST_F(RegistryTest, DecodeInstancesSharePositionsAndAreForgotten) {
  ASSERT_TRUE(Reg(Decode(0, 7)).ok());
  ASSERT_TRUE(Reg(Decode(0, 8)).ok());  // a second decode instance
  EXPECT_EQ(registry_->ListRanks()->size(), 2u);
  Advance(milliseconds(9 * 60 * 1000));
  ASSERT_TRUE(Beat(RankRole::kDecode, 0, 0, 0, 0, 8).ok());
  Advance(milliseconds(2 * 60 * 1000));  // 7 has been silent 11 min > 10 min
  Result<std::vector<RankStatus>> ranks = registry_->ListRanks();
  ASSERT_EQ(ranks->size(), 1u);
  EXPECT_EQ(ranks->front().record.incarnation, 8u);
  ExpectError(Beat(RankRole::kDecode, 0, 0, 0, 0, 7), StatusCode::kNotFound, "");
}

TEST_F(RegistryTest, FailureRecordsAreSequencedAndReadSince) {
  EXPECT_EQ(registry_->FailuresSince(0)->latest_seq, 0u);
  for (int i = 1; i <= 3; ++i) {
    Result<uint64_t> seq = Pub(RoomRecord(i));
    ASSERT_TRUE(seq.ok());
    EXPECT_EQ(*seq, static_cast<uint64_t>(i));
  }
  Result<FailureBatch> b = registry_->FailuresSince(1);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->latest_seq, 3u);
  EXPECT_FALSE(b->truncated);
  ASSERT_EQ(b->records.size(), 2u);
  EXPECT_EQ(b->records[0]["room"], 2);
  EXPECT_EQ(b->records[0]["seq"], 2);
  EXPECT_TRUE(registry_->FailuresSince(3)->records.empty());
  EXPECT_TRUE(registry_->FailuresSince(99)->records.empty());
  Result<FailureBatch> back = FailureBatch::FromJson(b->ToJson());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->ToJson(), b->ToJson());
}

struct RetentionCase {
  uint64_t since;
  size_t records;
  bool truncated;
};

class RegistryRetentionTest : public RegistryTest,
                              public ::testing::WithParamInterface<RetentionCase> {};

TEST_P(RegistryRetentionTest, KeepsTheMostRecentAndSaysWhenSomeWereDropped) {
  RegistryOptions o;
  o.max_failure_records = 2;
  Reset(o);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(Pub(RoomRecord(i)).ok());
  Result<FailureBatch> b = registry_->FailuresSince(GetParam().since);
  EXPECT_EQ(b->records.size(), GetParam().records);
  EXPECT_EQ(b->truncated, GetParam().truncated);
  EXPECT_EQ(b->latest_seq, 5u);
}

INSTANTIATE_TEST_SUITE_P(Since, RegistryRetentionTest,
                         ::testing::Values(RetentionCase{0, 2, true}, RetentionCase{2, 2, true},
                                           RetentionCase{3, 2, false}, RetentionCase{4, 1, false},
                                           RetentionCase{5, 0, false}));

struct BadRecordCase {
  json record;
  std::string names;
};

class RegistryBadFailureTest : public RegistryTest,
                               public ::testing::WithParamInterface<BadRecordCase> {};

TEST_P(RegistryBadFailureTest, IsInvalidArgument) {
  ExpectError(Pub(GetParam().record).status(), StatusCode::kInvalidArgument, GetParam().names);
  EXPECT_EQ(registry_->FailuresSince(0)->latest_seq, 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Records, RegistryBadFailureTest,
    ::testing::Values(
        BadRecordCase{json::array(), "expected a JSON object"},
        BadRecordCase{json{{"origin", 3}}, "origin"},
        BadRecordCase{json{{"cause", "peer_exited"}}, "'origin'"},
        BadRecordCase{json{{"origin", {{"role", "prefill"}, {"dp", 0}, {"tp", "1"}}}}, "'tp'"},
        BadRecordCase{json{{"origin", {{"role", 1}, {"tp", 1}}}}, "'role'"},
        BadRecordCase{
            json{{"origin",
                  {{"role", "prefill"}, {"dp", 0}, {"tp", 1}, {"pp", 0}, {"incarnation", -1}}}},
            "'incarnation'"},
        BadRecordCase{json{{"origin", {{"role", "prefill"}, {"dp", 0}, {"tp", 1}, {"pp", 0}}}},
                      "'cause'"}));

TEST_F(RegistryTest, FailureRecordMarksItsOriginDeadAndFencesIt) {
  ASSERT_TRUE(Reg(Prefill(0)).ok());
  ASSERT_TRUE(Reg(Prefill(1)).ok());
  ASSERT_TRUE(Reg(Decode(0, 7)).ok());
  // A stale report about an older incarnation and a non-rank origin mark nobody.
  json stale{{"origin", {{"role", "prefill"}, {"dp", 0}, {"tp", 1}, {"pp", 0}, {"incarnation", 5}}},
             {"cause", "peer_exited"}};
  ASSERT_TRUE(Pub(stale).ok());
  ASSERT_TRUE(Pub(json{{"origin", {{"role", "bootstrap"}, {"dp", 0}, {"tp", 0}, {"pp", 0}}},
                       {"cause", "peer_exited"}})
                  .ok());
  EXPECT_EQ(StatusAt(RankRole::kPrefill, 1).state, Liveness::kAlive);

  json killed{{"origin", {{"role", "prefill"}, {"dp", 0}, {"tp", 1}, {"pp", 0}}},
              {"cause", "peer_exited"}};
  Result<uint64_t> seq = Pub(killed);
  ASSERT_TRUE(seq.ok());
  RankStatus s = StatusAt(RankRole::kPrefill, 1);
  EXPECT_EQ(s.state, Liveness::kDead);
  EXPECT_EQ(s.dead_by_seq, *seq);
  EXPECT_EQ(StatusAt(RankRole::kPrefill, 0).state, Liveness::kAlive);
  ExpectError(Beat(RankRole::kPrefill, 0, 0, 1, 0, 101), StatusCode::kFailedPrecondition,
              "declared dead by failure record 3");
  ExpectError(Reg(Prefill(1)), StatusCode::kFailedPrecondition, "declared dead");
  // The restarted process comes back with a new incarnation.
  ASSERT_TRUE(Reg(Prefill(1, 2, 777)).ok());
  EXPECT_EQ(StatusAt(RankRole::kPrefill, 1).state, Liveness::kAlive);
  EXPECT_EQ(StatusAt(RankRole::kPrefill, 1).dead_by_seq, 0u);

  ASSERT_TRUE(Pub(json{{"origin",
                        {{"role", "decode"}, {"dp", 0}, {"tp", 0}, {"pp", 0}, {"incarnation", 7}}},
                       {"cause", "peer_unresponsive"}})
                  .ok());
  EXPECT_EQ(StatusAt(RankRole::kDecode, 0).state, Liveness::kDead);
}

TEST_F(RegistryTest, ARequestsOwnFailureMarksNoRankDeadAndAMistypedCauseIsRefused) {
  ASSERT_TRUE(Reg(Prefill(0)).ok());
  const json origin{{"role", "prefill"}, {"dp", 0}, {"tp", 0}, {"pp", 0}};
  // A room record (one request failed on a healthy rank) is kept for the
  // request's other ranks and marks nobody.
  for (const char* cause :
       {"aborted", "invalid_request", "deadline_exceeded", "layout_mismatch", "registry_lost"}) {
    Result<uint64_t> seq = Pub(json{{"origin", origin}, {"room", 9}, {"cause", cause}});
    ASSERT_TRUE(seq.ok()) << cause << ": " << seq.status().ToString();
    EXPECT_EQ(StatusAt(RankRole::kPrefill, 0).state, Liveness::kAlive) << cause;
  }
  Result<FailureBatch> batch = registry_->FailuresSince(0);
  ASSERT_TRUE(batch.ok());
  EXPECT_EQ(batch->records.size(), 5u);
  // A cause that is not a known name is refused before anything is kept:
  // a rank reading it back could not tell a death from a request's failure.
  for (const json& bad : {json(7), json::array({"aborted"}), json{{"x", 1}}, json("no_such")}) {
    ExpectError(Pub(json{{"origin", origin}, {"cause", bad}}).status(),
                StatusCode::kInvalidArgument, "'cause'");
  }
  EXPECT_EQ(StatusAt(RankRole::kPrefill, 0).state, Liveness::kAlive);
  EXPECT_EQ(registry_->FailuresSince(0)->records.size(), 5u);
}

TEST_F(RegistryTest, DecodeRegistrationsBeyondTheLimitAreRefusedByName) {
  RegistryOptions o;
  o.max_decode_ranks = 3;
  Reset(o);
  for (uint64_t inc = 1; inc <= 3; ++inc) ASSERT_TRUE(Reg(Decode(0, inc)).ok());
  ExpectError(Reg(Decode(0, 4)), StatusCode::kResourceExhausted, "max_decode_ranks");
  // A registered rank may register again; a silent one, once forgotten,
  // makes room.
  EXPECT_TRUE(Reg(Decode(0, 2)).ok());
  Advance(o.forget_decode_after + milliseconds(1));
  EXPECT_TRUE(Reg(Decode(0, 4)).ok());
  EXPECT_EQ(registry_->ListRanks()->size(), 1u);
}

TEST_F(RegistryTest, NewLayoutIsAcceptedOnceEveryOldPrefillRankIsDead) {
  ASSERT_TRUE(Reg(Prefill(0)).ok());
  ASSERT_TRUE(Reg(Prefill(1)).ok());
  ExpectError(Reg(Prefill(0, 4, 900)), StatusCode::kFailedPrecondition, "attn_tp_size 4");
  Advance(milliseconds(10001));
  ASSERT_TRUE(Reg(Prefill(0, 4, 900)).ok());
  ExpectError(registry_->GetParallelInfo().status(), StatusCode::kUnavailable, "1 of 4");
  ExpectError(registry_->GetRank(0, 0, 3, 0).status(), StatusCode::kUnavailable, "1 of 4");
}

TEST(RegistryOptionsTest, RejectsInconsistentThresholds) {
  RegistryOptions o;
  EXPECT_TRUE(ValidateRegistryOptions(o).ok());
  o.dead_after = milliseconds(500);
  ExpectError(ValidateRegistryOptions(o), StatusCode::kInvalidArgument, "dead_after");
  o = RegistryOptions();
  o.unresponsive_after = milliseconds(0);
  ExpectError(ValidateRegistryOptions(o), StatusCode::kInvalidArgument, "unresponsive_after");
  o = RegistryOptions();
  o.max_failure_records = 0;
  ExpectError(ValidateRegistryOptions(o), StatusCode::kInvalidArgument, "max_failure_records");
}

TEST(RegistryConcurrencyTest, ConcurrentCallsKeepTheTableConsistent) {
  std::unique_ptr<Registry> registry = CreateMemoryRegistry({});
  constexpr int kRanks = 8;
  std::vector<std::thread> threads;
  for (int tp = 0; tp < kRanks; ++tp) {
    threads.emplace_back([&, tp] {
      Result<std::string> credential = registry->Register(Prefill(tp, kRanks), "");
      ASSERT_TRUE(credential.ok());
      json record = RoomRecord(tp);
      record["detected_by"] = {
          {"role", "prefill"}, {"dp", 0}, {"tp", tp}, {"pp", 0}, {"incarnation", 100 + tp}};
      for (int i = 0; i < 200; ++i) {
        EXPECT_TRUE(
            registry->Heartbeat(RankRole::kPrefill, 0, 0, tp, 0, 100 + tp, *credential).ok());
        registry->GetRank(0, 0, tp, 0).status().IgnoreError();
        EXPECT_TRUE(registry->ListRanks().ok());
        if (i % 50 == 0) {
          EXPECT_TRUE(registry->Publish(record, *credential).ok());
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(registry->GetParallelInfo()->ranks_registered, kRanks);
  EXPECT_EQ(registry->FailuresSince(0)->latest_seq, 4u * kRanks);
}

}  // namespace
}  // namespace kvbridge::internal::registry_test
