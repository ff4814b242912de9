// Failure records and heartbeats are bound to the registered rank that
// sends them (issue 12: records only from authenticated ranks): forged ones
// are refused naming the rule and change nothing; honest ones with standing
// are kept.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "control/registry.h"
#include "control/registry_test_util.h"

namespace kvbridge::internal::registry_test {
namespace {

// A rank's id in a record, as a rank writes it.
json IdOf(const RankRecord& r) {
  return {{"role", RankRoleName(r.role)}, {"dp", r.attn_dp_rank}, {"cp", r.attn_cp_rank},
          {"tp", r.attn_tp_rank},         {"pp", r.pp_rank},      {"incarnation", r.incarnation}};
}

RankRecord DecodeDp(int dp, uint64_t inc) {
  RankRecord r = Decode(0, inc);
  r.attn_dp_size = 2;
  r.attn_dp_rank = dp;
  return r;
}

// A record that would fence `origin`, claiming `detected_by`, shown with
// the credential of `shown` (null: none). Each is refused: nothing kept.
struct ForgedCase {
  std::string name;
  std::function<RankRecord()> origin;
  std::function<json()> detected_by;
  std::function<const RankRecord*()> shown;
  std::string why;
};

class RegistryForgedRecordTest : public RegistryTest,
                                 public ::testing::WithParamInterface<ForgedCase> {
 public:
  static const RankRecord& P0() {
    static const RankRecord r = Prefill(0);
    return r;
  }
  static const RankRecord& P1() {
    static const RankRecord r = Prefill(1);
    return r;
  }
  static const RankRecord& D7() {
    static const RankRecord r = DecodeDp(0, 7);
    return r;
  }
  static const RankRecord& D8() {
    static const RankRecord r = DecodeDp(1, 8);
    return r;
  }
};

TEST_P(RegistryForgedRecordTest, IsPermissionDeniedAndChangesNothing) {
  for (const RankRecord* r : {&P0(), &P1(), &D7(), &D8()}) ASSERT_TRUE(Reg(*r).ok());
  const ForgedCase& c = GetParam();
  json record{
      {"cause", "peer_exited"}, {"origin", IdOf(c.origin())}, {"detected_by", c.detected_by()}};
  const RankRecord* shown = c.shown();
  const std::string credential =
      shown ? CredentialOf(shown->role, shown->key(), shown->incarnation) : "";
  ExpectError(registry_->Publish(record, credential).status(), StatusCode::kPermissionDenied,
              c.why);
  // Barrier: later calls see the table as it was.
  EXPECT_EQ(registry_->FailuresSince(0)->latest_seq, 0u);
  for (const RankStatus& s : *registry_->ListRanks()) {
    EXPECT_EQ(s.state, Liveness::kAlive) << s.record.Describe();
    EXPECT_EQ(s.dead_by_seq, 0u) << s.record.Describe();
  }
  for (const RankRecord* r : {&P0(), &P1(), &D7(), &D8()}) {
    EXPECT_TRUE(Beat(r->role, r->attn_dp_rank, 0, r->attn_tp_rank, 0, r->incarnation).ok());
  }
}

using F = RegistryForgedRecordTest;
INSTANTIATE_TEST_SUITE_P(
    Cases, RegistryForgedRecordTest,
    ::testing::Values(
        ForgedCase{"NoCredential", F::P0, [] { return IdOf(F::D7()); },
                   [] { return static_cast<const RankRecord*>(nullptr); },
                   "without a rank credential"},
        ForgedCase{"AnotherRanksCredential", F::P0, [] { return IdOf(F::D7()); },
                   [] { return &F::P1(); }, "not the one given to decode dp0 cp0 tp0"},
        ForgedCase{"InTheVictimsName", F::P0, [] { return IdOf(F::P0()); }, [] { return &F::D7(); },
                   "not the one given to prefill dp0 cp0 tp0"},
        ForgedCase{"UnregisteredReporter", F::P0, [] { return IdOf(Decode(1, 55)); },
                   [] { return &F::D7(); }, "incarnation 55, which is not registered"},
        ForgedCase{"ReplacedIncarnation", F::P0, [] { return IdOf(Prefill(1, 2, 5)); },
                   [] { return &F::P1(); }, "incarnation 5, which is not registered"},
        ForgedCase{"BootstrapAsReporter", F::P0,
                   [] {
                     return json{{"role", "bootstrap"}, {"dp", 0}, {"tp", 0}, {"pp", 0}};
                   },
                   [] { return &F::D7(); }, "names the bootstrap registry"},
        ForgedCase{"NoStandingAcrossDpGroups", F::D7, [] { return IdOf(F::D8()); },
                   [] { return &F::D8(); }, "no standing to declare decode dp0"}),
    [](const auto& info) { return info.param.name; });

TEST_F(RegistryTest, EachReporterWithStandingIsHeard) {
  const RankRecord p0 = Prefill(0), p1 = Prefill(1), d7 = DecodeDp(0, 7), d9 = DecodeDp(0, 9);
  for (const RankRecord* r : {&p0, &p1, &d7, &d9}) ASSERT_TRUE(Reg(*r).ok());
  // A request's failure naming another dp group fences nobody: any rank.
  ASSERT_TRUE(
      Pub(json{{"room", 3}, {"cause", "aborted"}, {"origin", IdOf(DecodeDp(1, 8))}}, p0).ok());
  // The other role (a peer), a sibling, the rank itself.
  ASSERT_TRUE(Pub(json{{"cause", "peer_exited"}, {"origin", IdOf(p1)}}, d7).ok());
  ASSERT_TRUE(Pub(json{{"cause", "peer_unresponsive"}, {"origin", IdOf(d9)}}, d7).ok());
  ASSERT_TRUE(Pub(json{{"cause", "local_error"}, {"origin", IdOf(p0)}}, p0).ok());
  EXPECT_EQ(StatusAt(RankRole::kPrefill, 1).dead_by_seq, 2u);
  EXPECT_EQ(StatusAt(RankRole::kPrefill, 0).dead_by_seq, 4u);
  // A fenced rank still reports about itself, and about nobody else.
  ASSERT_TRUE(Pub(json{{"room", 5}, {"cause", "aborted"}, {"origin", IdOf(p0)}}, p0).ok());
  ExpectError(Pub(json{{"cause", "peer_exited"}, {"origin", IdOf(d7)}}, p0).status(),
              StatusCode::kPermissionDenied, "a fenced rank reports only about itself");
  EXPECT_EQ(registry_->FailuresSince(0)->latest_seq, 5u);
  EXPECT_EQ(StatusAt(RankRole::kDecode, 0).dead_by_seq, 0u);  // d7, listed before d9
}

TEST_F(RegistryTest, HeartbeatsAndReRegistrationNeedTheRanksCredential) {
  const RankRecord p0 = Prefill(0), p1 = Prefill(1);
  ASSERT_TRUE(Reg(p0).ok());
  ASSERT_TRUE(Reg(p1).ok());
  const std::string p0_credential = CredentialOf(p0.role, p0.key(), p0.incarnation);
  const std::string p1_credential = CredentialOf(p1.role, p1.key(), p1.incarnation);
  EXPECT_GE(p0_credential.size(), 32u);  // >= 128 bits, hex
  EXPECT_NE(p0_credential, p1_credential);
  Advance(milliseconds(5000));
  // Someone else keeping prefill tp0 alive: refused, its age keeps growing.
  ExpectError(registry_->Heartbeat(RankRole::kPrefill, 0, 0, 0, 0, 100, p1_credential),
              StatusCode::kPermissionDenied, "not the one it was given");
  ExpectError(registry_->Heartbeat(RankRole::kPrefill, 0, 0, 0, 0, 100, ""),
              StatusCode::kPermissionDenied, "without its rank credential");
  EXPECT_EQ(StatusAt(RankRole::kPrefill, 0).age, milliseconds(5000));
  // Taking over the live registration unseen (same incarnation, another
  // address): refused and the record is unchanged.
  RankRecord takeover = p0;
  takeover.rank_ip = "10.6.6.6";
  ExpectError(registry_->Register(takeover, "").status(), StatusCode::kPermissionDenied,
              "registers again");
  ExpectError(registry_->Register(takeover, p1_credential).status(), StatusCode::kPermissionDenied,
              "registers again");
  EXPECT_EQ(StatusAt(RankRole::kPrefill, 0).record.rank_ip, "10.0.0.1");
  // The rank itself may, and keeps its credential.
  Result<std::string> again = registry_->Register(p0, p0_credential);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, p0_credential);
  EXPECT_TRUE(Beat(RankRole::kPrefill, 0, 0, 0, 0, 100).ok());
  EXPECT_EQ(StatusAt(RankRole::kPrefill, 0).age, milliseconds(0));
}

}  // namespace
}  // namespace kvbridge::internal::registry_test
