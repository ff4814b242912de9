#include "tests/integration/etcd/leader_check.h"

#include <gtest/gtest.h>

#include <vector>

#include "control/record_json.h"

namespace kvbridge::tools::etcd_check {

using internal::EtcdRegistryClient;
using internal::Liveness;
using internal::RankStatus;
using nlohmann::json;
using std::chrono::milliseconds;

FailureRecord RoomRecord(uint64_t room) {
  FailureRecord f;
  f.origin.role = Role::kDecode;
  f.origin.tp = 0;
  f.room = room;
  f.cause = FailureCause::kAborted;
  f.detail = "test record " + std::to_string(room);
  return f;
}

int CountAlive(const EtcdRegistryClient& etcd) {
  int n = 0;
  const std::vector<RankStatus> ranks = etcd.ListRanks().value();
  for (const RankStatus& s : ranks) n += s.state == Liveness::kAlive;
  return n;
}

uint64_t Finished(const ProcessInfo& p) {
  if (p.report) return (*p.report)["finished"].get<uint64_t>();
  return p.progress ? (*p.progress)["finished"].get<uint64_t>() : 0;
}

bool WaitInEtcd(Cluster& c, const EtcdRegistryClient& etcd, const std::function<bool()>& done,
                milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const uint64_t seen = etcd.changes();
    if (done()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    c.Pump(milliseconds(0));
    etcd.AwaitChange(seen, milliseconds(100));
  }
}

namespace {

constexpr uint64_t kRoomBase = uint64_t{1} << 60;

void Publish(const EtcdRegistryClient& watcher, int i) {
  Result<uint64_t> seq =
      watcher.PublishFailure(internal::FailureRecordToJson(RoomRecord(kRoomBase + i)));
  ASSERT_TRUE(seq.ok()) << seq.status().ToString();
  EXPECT_EQ(*seq, static_cast<uint64_t>(i + 1));
}

// Every rank succeeded every request; every registration and every record
// survived the leader, in order.
void ExpectNothingLost(const Cluster& c, const EtcdRegistryClient& watcher, int requests) {
  for (int i = 0; i < c.num_ranks(); ++i) {
    const ProcessInfo& p = c.process(i);
    SCOPED_TRACE(p.name);
    ASSERT_TRUE(p.report.has_value()) << p.exit.ToString();
    const json& r = *p.report;
    EXPECT_EQ(r["failed"].get<int>(), 0) << r["failures"].dump();
    EXPECT_EQ(r["succeeded"].get<int>(), requests);
    EXPECT_EQ(r["corrupt_pages"].get<int>(), 0);
  }
  // Alive: their keep-alives moved to another member.
  EXPECT_EQ(CountAlive(watcher), 4);
  internal::FailureBatch batch = watcher.FailuresSince(0).value();
  ASSERT_EQ(batch.records.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(batch.records[i]["seq"].get<uint64_t>(), i + 1);
    EXPECT_EQ(batch.records[i]["room"].get<uint64_t>(), kRoomBase + i);
  }
}

}  // namespace

void KillLeaderMidRun(Cluster& c, EtcdCluster& etcd, const EtcdRegistryClient& watcher,
                      int requests, LeaderKill* out) {
  for (int i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(Publish(watcher, i));
  ASSERT_TRUE(WaitInEtcd(
      c, watcher, [&] { return CountAlive(watcher) == 4; }, milliseconds(20000)))
      << watcher.ListRanks()->size() << " ranks in etcd";
  Status progressed = c.PumpUntil(
      [&] {
        for (int d = 0; d < c.decode_tp(); ++d)
          if (Finished(c.process(c.RankIndex(Role::kDecode, d))) < 30) return false;
        return true;
      },
      milliseconds(60000));
  ASSERT_TRUE(progressed.ok()) << progressed.ToString();
  Result<int> leader = etcd.Leader(milliseconds(5000));
  ASSERT_TRUE(leader.ok()) << leader.status().ToString();
  ASSERT_TRUE(etcd.Kill(*leader).ok());
  EXPECT_FALSE(etcd.running(*leader));
  // Writes during the election wait for the new leader; none is lost.
  for (int i = 3; i < 5; ++i) ASSERT_NO_FATAL_FAILURE(Publish(watcher, i));
  Result<int> next = etcd.Leader(milliseconds(10000));
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_NE(*next, *leader);
  out->killed = *leader;
  out->next = *next;
  Status reported = c.CollectReports(milliseconds(120000));
  ASSERT_TRUE(reported.ok()) << reported.ToString();
  ExpectNothingLost(c, watcher, requests);
}

}  // namespace kvbridge::tools::etcd_check
