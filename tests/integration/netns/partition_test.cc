// Network faults between hosts (tools/hosts.h): two independent pairs
// (prefill host 1 -> decode host 2, prefill host 3 -> decode host 4), each
// with its own bootstrap server on host 0; one host of pair A is cut off by
// nftables rules inside its namespace while every process lives on, or goes
// silent (link down, its processes stopped) and comes back.
//
// Every survivor of pair A must fail the affected requests within 2 s of
// the cut, naming the cut-off rank (role, rank, host) as unreachable, never
// as exited; pair B must not notice; after the partition heals, the cut-off
// rank learns it was declared failed and fences itself (it blames nobody
// for its own isolation), and no write of the fenced side lands in pages
// the survivor reuses.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "tests/integration/netns/hosts_util.h"

namespace kvbridge::tools {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr int kRequests = 500;

uint64_t Count(const ProcessInfo& p, const char* field) {
  if (p.report) return (*p.report)[field].get<uint64_t>();
  return p.progress ? (*p.progress)[field].get<uint64_t>() : 0;
}

// Pumps both clusters (neither's children may block on a full pipe) until
// `done` holds; false after `timeout`.
bool PumpBoth(Cluster& a, Cluster& b, const std::function<bool()>& done, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    a.Pump(milliseconds(20));
    b.Pump(milliseconds(20));
  }
  return true;
}

bool AllReported(const Cluster& c) {
  for (int i = 0; i < c.num_ranks(); ++i)
    if (!c.process(i).report && !c.process(i).stdout_closed) return false;
  return true;
}

struct PartitionCase {
  std::string name;
  Role victim;  // the role whose host is cut off
  Direction direction;
  // Instead of a partition: the host goes silent (link down and every
  // process on it SIGSTOPped) and comes back (link up, SIGCONT).
  bool silent = false;
};

class PartitionTest : public ::testing::TestWithParam<PartitionCase> {};

TEST_P(PartitionTest, SurvivorsNameTheUnreachableRankAndTheOtherPairGoesOn) {
  KVB_SKIP_WITHOUT_HOSTS();
  const PartitionCase& pc = GetParam();
  auto created = HostNet::Create(5);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  HostNet& net = **created;
  const std::string logs = NewLogDir();
  auto a = StartCluster(net, {.prefill_tp = 1, .decode_tp = 1, .rank_hosts = {1, 2}}, 0,
                        HostWorkload(kRequests, 8), logs + "/a");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = StartCluster(net, {.prefill_tp = 1, .decode_tp = 1, .rank_hosts = {3, 4}}, 0,
                        HostWorkload(kRequests, 8), logs + "/b");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  Cluster& ca = **a;
  Cluster& cb = **b;
  const int victim = ca.RankIndex(pc.victim, 0);
  const int survivor =
      ca.RankIndex(pc.victim == Role::kPrefill ? Role::kDecode : Role::kPrefill, 0);
  const int victim_host = pc.victim == Role::kPrefill ? 1 : 2;
  const int decode_b = cb.RankIndex(Role::kDecode, 0);
  ASSERT_TRUE(PumpBoth(
      ca, cb,
      [&] {
        return Count(ca.process(ca.RankIndex(Role::kDecode, 0)), "succeeded") >= 20 &&
               Count(cb.process(decode_b), "succeeded") >= 20;
      },
      milliseconds(60000)));

  const int64_t cut_at = WallMicros();
  if (pc.silent) {
    ASSERT_TRUE(net.SetLink(victim_host, false).ok());
    ASSERT_TRUE(ca.Signal(victim, SIGSTOP).ok());
  } else {
    ASSERT_TRUE(net.Partition(victim_host, pc.direction).ok());
  }
  // Cut until the survivor has failed requests over it, then healed.
  ASSERT_TRUE(PumpBoth(
      ca, cb, [&] { return Count(ca.process(survivor), "failed") > 0; }, milliseconds(20000)))
      << "the survivor failed nothing after the partition (logs in " << logs << ")";
  if (pc.silent) {
    ASSERT_TRUE(net.SetLink(victim_host, true).ok());
    ASSERT_TRUE(ca.Signal(victim, SIGCONT).ok());
  } else {
    ASSERT_TRUE(net.Heal(victim_host).ok());
  }
  ASSERT_TRUE(PumpBoth(
      ca, cb, [&] { return AllReported(ca) && AllReported(cb); }, milliseconds(120000)))
      << "logs in " << logs;

  const ProcessInfo& v = ca.process(victim);
  const std::string victim_host_name = net.hostname(victim_host);
  // The survivor: every failure names the cut-off rank on its host as
  // unreachable; the first within 2 s of the cut.
  {
    const ProcessInfo& p = ca.process(survivor);
    SCOPED_TRACE(p.name);
    ASSERT_TRUE(p.report.has_value()) << p.exit.ToString();
    const json& r = *p.report;
    EXPECT_EQ(r["nonterminal"].get<int>(), 0);
    EXPECT_EQ(r["corrupt_pages"].get<int>(), 0) << "a write of the fenced side landed";
    EXPECT_EQ(r["finished"].get<int>(), kRequests);
    EXPECT_GT(r["failed"].get<int>(), 0);
    int64_t first = INT64_MAX;
    for (const json& f : r["failures"]) {
      SCOPED_TRACE(f.dump());
      EXPECT_EQ(f["origin"]["name"].get<std::string>(), v.name);
      EXPECT_EQ(f["origin"]["host"].get<std::string>(), victim_host_name);
      EXPECT_EQ(f["origin"]["pid"].get<int>(), v.own_pid);
      EXPECT_EQ(f["cause"].get<std::string>(), "peer_unreachable");
      first = std::min(first, f["detected_at_us"].get<int64_t>());
    }
    const double detect_ms = (first - cut_at) / 1000.0;
    std::printf("DETECTION partition=%s ms=%.0f\n", pc.name.c_str(), detect_ms);
    EXPECT_LE(detect_ms, 2000.0);
    EXPECT_GT(detect_ms, 0.0);
  }
  // The cut-off rank cannot tell which side was cut: its own requests fail
  // naming the survivor as unreachable, itself (fenced) or the registry it
  // lost; never as exited. That blame never reached the registry: the
  // survivor was not declared failed (its failures all name the victim).
  {
    SCOPED_TRACE(v.name);
    ASSERT_TRUE(v.report.has_value()) << v.exit.ToString();
    const json& r = *v.report;
    EXPECT_EQ(r["nonterminal"].get<int>(), 0);
    EXPECT_EQ(r["corrupt_pages"].get<int>(), 0);
    EXPECT_GT(r["failed"].get<int>(), 0);
    for (const json& f : r["failures"]) {
      SCOPED_TRACE(f.dump());
      EXPECT_NE(f["cause"].get<std::string>(), "peer_exited");
      EXPECT_NE(f["cause"].get<std::string>(), "unknown");
    }
  }
  // Pair B never noticed.
  for (int i = 0; i < cb.num_ranks(); ++i) {
    const ProcessInfo& p = cb.process(i);
    SCOPED_TRACE("pair B " + p.name);
    ASSERT_TRUE(p.report.has_value()) << p.exit.ToString();
    EXPECT_EQ((*p.report)["succeeded"].get<int>(), kRequests);
    EXPECT_EQ((*p.report)["corrupt_pages"].get<int>(), 0);
  }
  cb.Shutdown(milliseconds(10000));
  ca.Shutdown(milliseconds(10000));
}

INSTANTIATE_TEST_SUITE_P(
    Cut, PartitionTest,
    ::testing::Values(PartitionCase{"prefill_host", Role::kPrefill, Direction::kBoth},
                      PartitionCase{"decode_host", Role::kDecode, Direction::kBoth},
                      PartitionCase{"prefill_host_outgoing_only", Role::kPrefill,
                                    Direction::kOutgoing},
                      PartitionCase{"silent_prefill_host", Role::kPrefill, Direction::kBoth,
                                    /*silent=*/true},
                      PartitionCase{"silent_decode_host", Role::kDecode, Direction::kBoth,
                                    /*silent=*/true}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace kvbridge::tools
