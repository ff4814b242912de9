// EtcdView without etcd: events in, liveness and records out, "now" given.
#include "control/etcd_view.h"

#include <gtest/gtest.h>

#include "control/record_json.h"

namespace kvbridge::internal {
namespace {

using std::chrono::milliseconds;
using Time = EtcdView::Time;

const std::string kPrefix = "/kvbridge/t/";

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
  v.Apply(Put("ranks/" + path, EncodeEtcdRank(r, milliseconds(1000), milliseconds(3000))), now);
  v.Apply(Put("alive/" + path, EncodeEtcdAlive(r.incarnation)), now);
}

TEST(EtcdViewTest, AliveThenUnresponsiveThenDeadAsTheLeasesGo) {
  EtcdView v(kPrefix);
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
  EtcdView v(kPrefix);
  const Time t0 = std::chrono::steady_clock::now();
  Register(v, Prefill(0, 5), t0);
  Register(v, Prefill(1, 7), t0);
  ASSERT_TRUE(v.GetParallelInfo().ok());
  FailureRecord f;
  f.origin.role = Role::kPrefill;
  f.origin.tp = 1;
  f.origin.incarnation = 7;
  f.cause = FailureCause::kPeerExited;
  v.Apply(Put("failures/" + EtcdSeqKey(1), EncodeEtcdFailure(1, FailureRecordToJson(f))), t0);
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
  EtcdView v(kPrefix);
  const Time t0 = std::chrono::steady_clock::now();
  Register(v, Prefill(0, 5), t0);
  v.Reset({}, t0 + milliseconds(10));
  ASSERT_EQ(v.ListRanks(t0 + milliseconds(10)).size(), 1u);
  EXPECT_EQ(v.ListRanks(t0 + milliseconds(10))[0].state, Liveness::kDead);
}

}  // namespace
}  // namespace kvbridge::internal
