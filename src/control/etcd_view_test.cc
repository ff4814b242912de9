// EtcdView without etcd: events in, liveness and records out, "now" given.
#include "control/etcd_view.h"

#include <gtest/gtest.h>

#include "control/record_json.h"

namespace kvbridge::internal {
namespace {

using std::chrono::milliseconds;
using Time = EtcdView::Time;

const std::string kPrefix = "/kvbridge/t/";
const EtcdSeal kSeal("etcd view test secret");

RankRecord Prefill(int tp, uint64_t incarnation) {
  RankRecord r;
  r.attn_tp_size = 2;
  r.attn_tp_rank = tp;
  r.rank_ip = "127.0.0.1";
  r.page_size = 16;
  r.kv_cache_dtype = "bfloat16";
  r.host = "h";
  r.incarnation = incarnation;
  return r;
}

EtcdEvent Put(const std::string& rest, const std::string& value) {
  EtcdEvent e;
  e.kv.key = kPrefix + rest;
  e.kv.value = value;
  return e;
}

EtcdEvent Delete(const std::string& rest) {
  EtcdEvent e;
  e.is_delete = true;
  e.kv.key = kPrefix + rest;
  return e;
}

void Register(EtcdView& v, const RankRecord& r, Time now) {
  const std::string path = EtcdRankPath(r.role, r.key(), r.incarnation);
  v.Apply(Put("ranks/" + path, EncodeEtcdRank(kSeal, kPrefix + "ranks/" + path, r,
                                              milliseconds(1000), milliseconds(3000))),
          now);
  v.Apply(Put("alive/" + path, EncodeEtcdAlive(kSeal, kPrefix + "alive/" + path, r.incarnation)),
          now);
}

TEST(EtcdViewTest, AliveThenUnresponsiveThenDeadAsTheLeasesGo) {
  EtcdView v(kPrefix, kSeal);
  const Time t0 = std::chrono::steady_clock::now();
  Register(v, Prefill(0, 5), t0);
  ASSERT_EQ(v.ListRanks(t0).size(), 1u);
  EXPECT_EQ(v.ListRanks(t0)[0].state, Liveness::kAlive);
  EXPECT_EQ(v.ListRanks(t0)[0].age.count(), 0);

  v.Apply(Delete("alive/prefill/dp0/cp0/tp0/pp0"), t0 + milliseconds(100));
  RankStatus s = v.ListRanks(t0 + milliseconds(600))[0];
  EXPECT_EQ(s.state, Liveness::kUnresponsive);
  EXPECT_EQ(s.age.count(), 1000 + 500);  // the lease's TTL before its expiry, then 500 ms

  v.Apply(Delete("ranks/prefill/dp0/cp0/tp0/pp0"), t0 + milliseconds(2000));
  s = v.ListRanks(t0 + milliseconds(2000))[0];
  EXPECT_EQ(s.state, Liveness::kDead);
  EXPECT_EQ(s.age.count(), 3000);
  EXPECT_EQ(s.dead_by_seq, 0u);
  EXPECT_EQ(v.GetRank(0, 0, 0, 0).status().code(), StatusCode::kUnavailable);  // 1 of 2

  // A new incarnation at the position is a restart.
  Register(v, Prefill(0, 6), t0 + milliseconds(3000));
  s = v.ListRanks(t0 + milliseconds(3000))[0];
  EXPECT_EQ(s.state, Liveness::kAlive);
  EXPECT_EQ(s.restarts, 1u);
  EXPECT_EQ(s.record.incarnation, 6u);
}

TEST(EtcdViewTest, AFailureRecordFencesTheIncarnationItNames) {
  EtcdView v(kPrefix, kSeal);
  const Time t0 = std::chrono::steady_clock::now();
  Register(v, Prefill(0, 5), t0);
  Register(v, Prefill(1, 7), t0);
  ASSERT_TRUE(v.GetParallelInfo().ok());
  FailureRecord f;
  f.origin.role = Role::kPrefill;
  f.origin.tp = 1;
  f.origin.incarnation = 7;
  f.cause = FailureCause::kPeerExited;
  const std::string key = "failures/" + EtcdSeqKey(1);
  v.Apply(Put(key, EncodeEtcdFailure(kSeal, kPrefix + key, 1, FailureRecordToJson(f))), t0);
  EXPECT_EQ(v.DeadBySeq(RankRole::kPrefill, RankKey{0, 0, 1, 0}, 7), 1u);
  EXPECT_EQ(v.DeadBySeq(RankRole::kPrefill, RankKey{0, 0, 1, 0}, 8), 0u);  // another process
  EXPECT_EQ(v.DeadBySeq(RankRole::kPrefill, RankKey{0, 0, 0, 0}, 5), 0u);
  std::vector<RankStatus> ranks = v.ListRanks(t0);
  EXPECT_EQ(ranks[0].state, Liveness::kAlive);
  EXPECT_EQ(ranks[1].state, Liveness::kDead);
  EXPECT_EQ(ranks[1].dead_by_seq, 1u);
  FailureBatch b = v.FailuresSince(0);
  ASSERT_EQ(b.records.size(), 1u);
  EXPECT_EQ(b.records[0]["seq"], 1);
  EXPECT_EQ(v.FailuresSince(1).records.size(), 0u);
  // A layout change is refused while a live rank has the old one.
  RankRecord other = Prefill(1, 9);
  other.attn_tp_size = 4;
  EXPECT_EQ(v.CheckLayout(other, t0).code(), StatusCode::kFailedPrecondition);
}

TEST(EtcdViewTest, ResetMarksRanksMissingFromTheReadDeleted) {
  EtcdView v(kPrefix, kSeal);
  const Time t0 = std::chrono::steady_clock::now();
  Register(v, Prefill(0, 5), t0);
  v.Reset({}, t0 + milliseconds(10));
  ASSERT_EQ(v.ListRanks(t0 + milliseconds(10)).size(), 1u);
  EXPECT_EQ(v.ListRanks(t0 + milliseconds(10))[0].state, Liveness::kDead);
}

// The seal, without etcd: a value opens only under the deployment's secret
// and at the key it was sealed for.
TEST(EtcdViewTest, AValueNotSealedForItsKeyWithTheDeploymentsSecretIsNotUsed) {
  EtcdView v(kPrefix, kSeal);
  const Time t0 = std::chrono::steady_clock::now();
  Register(v, Prefill(0, 5), t0);
  Register(v, Prefill(1, 7), t0);
  v.Apply(Delete("alive/prefill/dp0/cp0/tp1/pp0"), t0);
  FailureRecord f;
  f.origin.role = Role::kPrefill;
  f.origin.incarnation = 5;
  f.cause = FailureCause::kPeerExited;
  const std::string k1 = "failures/" + EtcdSeqKey(1), k2 = "failures/" + EtcdSeqKey(2);
  const EtcdSeal other("another secret");
  v.Apply(Put(k1, EncodeEtcdFailure(other, kPrefix + k1, 1, FailureRecordToJson(f))), t0);
  // Sealed for k1, put at k2 (its seq field changed to match k2's).
  nlohmann::json moved =
      nlohmann::json::parse(EncodeEtcdFailure(kSeal, kPrefix + k1, 1, FailureRecordToJson(f)));
  moved["seq"] = 2;
  v.Apply(Put(k2, moved.dump()), t0);
  // tp0's alive value at tp1's alive key.
  v.Apply(Put("alive/prefill/dp0/cp0/tp1/pp0",
              EncodeEtcdAlive(kSeal, kPrefix + "alive/prefill/dp0/cp0/tp0/pp0", 7)),
          t0);
  EXPECT_EQ(v.DeadBySeq(RankRole::kPrefill, RankKey{0, 0, 0, 0}, 5), 0u);
  EXPECT_TRUE(v.FailuresSince(0).records.empty());
  EXPECT_EQ(v.ListRanks(t0)[0].state, Liveness::kAlive);
  EXPECT_EQ(v.ListRanks(t0)[1].state, Liveness::kUnresponsive);
  ASSERT_EQ(v.problems().size(), 3u);
  for (const auto& [key, why] : v.problems())
    EXPECT_NE(why.find("not this deployment's for this key"), std::string::npos) << key << why;
  // A tag of the wrong type, or a huge one: refused as such, nothing used.
  const std::string k3 = "failures/" + EtcdSeqKey(3), k4 = "failures/" + EtcdSeqKey(4);
  nlohmann::json typed =
      nlohmann::json::parse(EncodeEtcdFailure(kSeal, kPrefix + k3, 3, FailureRecordToJson(f)));
  typed["mac"] = 12;
  v.Apply(Put(k3, typed.dump()), t0);
  nlohmann::json huge =
      nlohmann::json::parse(EncodeEtcdFailure(kSeal, kPrefix + k4, 4, FailureRecordToJson(f)));
  huge["mac"] = std::string(100000, 'a');
  v.Apply(Put(k4, huge.dump()), t0);
  EXPECT_NE(v.problems().at(kPrefix + k3).find("carries no tag"), std::string::npos);
  EXPECT_NE(v.problems().at(kPrefix + k4).find("not this deployment's"), std::string::npos);
  EXPECT_TRUE(v.FailuresSince(0).records.empty());
  v.Apply(Delete(k3), t0);
  v.Apply(Delete(k4), t0);
  // The same record sealed for its key with the secret is used.
  v.Apply(Put(k2, EncodeEtcdFailure(kSeal, kPrefix + k2, 2, FailureRecordToJson(f))), t0);
  EXPECT_EQ(v.DeadBySeq(RankRole::kPrefill, RankKey{0, 0, 0, 0}, 5), 2u);
  EXPECT_EQ(v.problems().size(), 2u);
}

}  // namespace
}  // namespace kvbridge::internal
