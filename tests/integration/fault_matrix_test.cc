// The fault matrix: prefill and decode instances as real processes with many
// rooms in flight; a fault injected from outside the victim; what every
// surviving rank reports is checked by one shared helper.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <map>
#include <string>
#include <vector>

#include "tools/cluster.h"

namespace kvbridge::tools {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

std::vector<std::string> Workload(int requests, int concurrency) {
  return {"--layers", "2", "--heads", "8", "--head-dim", "16", "--page-size", "16", "--min-tokens",
          "256", "--max-tokens", "2048", "--chunk-tokens", "512", "--requests",
          std::to_string(requests), "--concurrency", std::to_string(concurrency), "--pool-pages",
          "16384", "--heartbeat-ms", "100", "--heartbeat-misses", "10", "--progress-ms", "100",
          "--deadline-s", "90", "--quiesce-timeout-ms", "5000",
          // Paced so a fault always meets rooms in every phase.
          "--rate", "100"};
}

struct Matrix {
  std::unique_ptr<Cluster> cluster;
  ClusterOptions options;
};

Matrix Launch(int prefill_tp, int decode_tp, std::vector<std::string> args,
              BootstrapMode bootstrap = BootstrapMode::kStandalone) {
  Matrix m;
  m.options.binary = std::string(KVB_BIN_DIR) + "/kvbridge";
  m.options.prefill_tp = prefill_tp;
  m.options.decode_tp = decode_tp;
  m.options.bootstrap = bootstrap;
  m.options.worker_args = std::move(args);
  auto c = Cluster::Start(m.options);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (c.ok()) m.cluster = std::move(c).value();
  return m;
}

uint64_t Finished(const ProcessInfo& p) {
  if (p.report) return (*p.report)["finished"].get<uint64_t>();
  return p.progress ? (*p.progress)["finished"].get<uint64_t>() : 0;
}

// Waits until every decode rank finished `n` rooms: the fault then hits a
// stream in full flight.
void WaitForProgress(Cluster& c, uint64_t n) {
  Status s = c.PumpUntil(
      [&] {
        for (int d = 0; d < c.decode_tp(); ++d)
          if (Finished(c.process(c.RankIndex(Role::kDecode, d))) < n) return false;
        return true;
      },
      milliseconds(60000));
  ASSERT_TRUE(s.ok()) << s.ToString();
}

struct Expect {
  std::string origin;               // "prefill tp1", "bootstrap server", ...
  int origin_pid = -1;              // -1: not checked
  std::vector<std::string> causes;  // any of these
  std::string detail_has;           // "" = not checked
  std::string phase;                // "" = not checked
  bool every_rank_failed_some = true;
  // Another origin a failure may name, only with this in its detail ("" =
  // none): see StalledTransferHitsTheDeadlineNamingPhaseAndPeer.
  std::string alt_origin;
  std::string alt_detail_has;
};

// The shared assertion: every surviving rank finished every room (no hang),
// wrote nothing corrupt, leaked no room state, and every failure it reports
// names the expected origin and cause — never an unknown origin or a generic
// cause.
void ExpectSurvivorsReport(Cluster& c, const std::vector<int>& victims, const Expect& e) {
  for (int i = 0; i < c.num_ranks(); ++i) {
    if (std::find(victims.begin(), victims.end(), i) != victims.end()) continue;
    const ProcessInfo& p = c.process(i);
    SCOPED_TRACE(p.name);
    ASSERT_TRUE(p.report.has_value())
        << p.name << " printed no report (" << p.exit.ToString() << ")";
    const json& r = *p.report;
    EXPECT_EQ(r["nonterminal"].get<int>(), 0) << "rooms left hanging";
    EXPECT_EQ(r["corrupt_pages"].get<int>(), 0);
    EXPECT_EQ(r["stats_after"]["rooms_live"].get<int>(), 0) << "leaked per-room state";
    EXPECT_EQ(r["finished"].get<int>(), r["requests"].get<int>());
    if (e.every_rank_failed_some) {
      EXPECT_GT(r["failed"].get<int>(), 0) << r.dump();
    }
    for (const json& f : r["failures"]) {
      SCOPED_TRACE(f.dump());
      ASSERT_TRUE(f.contains("origin")) << "failure without origin";
      EXPECT_NE(f["cause"].get<std::string>(), "unknown");
      if (!e.alt_origin.empty() && f["origin"]["name"] == e.alt_origin) {
        EXPECT_NE(f["detail"].get<std::string>().find(e.alt_detail_has), std::string::npos);
      } else {
        EXPECT_EQ(f["origin"]["name"].get<std::string>(), e.origin);
      }
      if (e.origin_pid > 0) {
        EXPECT_EQ(f["origin"]["pid"].get<int>(), e.origin_pid);
      }
      EXPECT_NE(std::find(e.causes.begin(), e.causes.end(), f["cause"].get<std::string>()),
                e.causes.end());
      if (!e.detail_has.empty()) {
        EXPECT_NE(f["detail"].get<std::string>().find(e.detail_has), std::string::npos);
      }
      if (!e.phase.empty()) {
        EXPECT_EQ(f["phase"].get<std::string>(), e.phase);
      }
      EXPECT_FALSE(f["mechanism"].get<std::string>().empty());
      EXPECT_FALSE(f["hint"].get<std::string>().empty());
      // sglang's flag: set exactly when the origin is another rank.
      bool self =
          f["origin"]["name"] == r["rank"]["name"] && f["origin"]["pid"] == r["rank"]["pid"];
      EXPECT_EQ(f["is_from_another_rank"].get<bool>(), !self);
    }
  }
}

class KillPrefillTest : public ::testing::TestWithParam<int> {};

TEST_P(KillPrefillTest, SiblingsAndDecodeNameTheDeadRank) {
  const int prefill_tp = GetParam();
  Matrix m = Launch(prefill_tp, 2, Workload(400, 24));
  ASSERT_TRUE(m.cluster);
  Cluster& c = *m.cluster;
  WaitForProgress(c, 20);
  const int victim = c.RankIndex(Role::kPrefill, 1);
  const int pid = c.process(victim).pid;
  ASSERT_TRUE(c.Signal(victim, SIGKILL).ok());
  ASSERT_TRUE(c.CollectReports(milliseconds(120000), {victim}).ok());
  ExpectSurvivorsReport(
      c, {victim},
      {.origin = "prefill tp1", .origin_pid = pid, .causes = {"peer_exited", "peer_unreachable"}});
  c.Shutdown(milliseconds(10000));
}

INSTANTIATE_TEST_SUITE_P(PrefillTp, KillPrefillTest, ::testing::Values(2, 4));

TEST(FaultMatrixTest, KilledDecodeRankIsNamedByPrefillWhichReleasesItsRooms) {
  Matrix m = Launch(2, 2, Workload(400, 24));
  ASSERT_TRUE(m.cluster);
  Cluster& c = *m.cluster;
  WaitForProgress(c, 20);
  const int victim = c.RankIndex(Role::kDecode, 1);
  const int pid = c.process(victim).pid;
  ASSERT_TRUE(c.Signal(victim, SIGKILL).ok());
  ASSERT_TRUE(c.CollectReports(milliseconds(120000), {victim}).ok());
  ExpectSurvivorsReport(
      c, {victim},
      {.origin = "decode tp1", .origin_pid = pid, .causes = {"peer_exited", "peer_unreachable"}});
  c.Shutdown(milliseconds(10000));
}

TEST(FaultMatrixTest, StoppedRankIsUnresponsiveNotExited) {
  Matrix m = Launch(2, 2, Workload(300, 16));
  ASSERT_TRUE(m.cluster);
  Cluster& c = *m.cluster;
  WaitForProgress(c, 20);
  const int victim = c.RankIndex(Role::kPrefill, 1);
  const int pid = c.process(victim).pid;
  ASSERT_TRUE(c.Signal(victim, SIGSTOP).ok());
  ASSERT_TRUE(c.CollectReports(milliseconds(120000), {victim}).ok());
  ExpectSurvivorsReport(c, {victim},
                        {.origin = "prefill tp1",
                         .origin_pid = pid,
                         .causes = {"peer_unresponsive"},
                         .detail_has = "stopped"});
  // SIGCONT: the rank learns it was declared failed; what it still held
  // fails naming itself, and it rejoins under a new incarnation
  // (docs/protocol.md). Its partners are done: it admits nothing more.
  ASSERT_TRUE(c.WriteLine(victim, "limit 0").ok());
  ASSERT_TRUE(c.Signal(victim, SIGCONT).ok());
  ASSERT_TRUE(c.CollectReports(milliseconds(120000)).ok());
  const json& r = *c.process(victim).report;
  EXPECT_EQ(r["nonterminal"].get<int>(), 0);
  for (const json& f : r["failures"]) {
    EXPECT_EQ(f["origin"]["pid"].get<int>(), pid) << f.dump();
    EXPECT_EQ(f["cause"].get<std::string>(), "peer_unresponsive") << f.dump();
  }
  c.Shutdown(milliseconds(10000));
}

TEST(FaultMatrixTest, KilledBootstrapFailsNewRequestsNamingTheRegistry) {
  Matrix m = Launch(2, 2, Workload(300, 8));
  ASSERT_TRUE(m.cluster);
  Cluster& c = *m.cluster;
  WaitForProgress(c, 20);
  ASSERT_TRUE(c.Signal(c.bootstrap_index(), SIGKILL).ok());
  ASSERT_TRUE(c.CollectReports(milliseconds(120000), {c.bootstrap_index()}).ok());
  ExpectSurvivorsReport(c, {c.bootstrap_index()},
                        {.origin = "bootstrap server", .causes = {"registry_lost"}});
  // Requests past bootstrap before the kill completed.
  for (int i = 0; i < c.num_ranks(); ++i)
    EXPECT_GE(c.process(i).report->at("succeeded").get<int>(), 20) << c.process(i).name;
  c.Shutdown(milliseconds(10000));
}

// Issue 10, defect 2, across processes: a registry that accepts connections
// and never answers (the standalone bootstrap server SIGSTOPped: the kernel
// still completes every TCP handshake, and each registry call waits out its
// 2 s timeout) delays neither heartbeat rounds nor detection of a rank that
// dies at the same moment. The ranks connected to the dead one name it
// within 2 s of the kill; every survivor keeps its heartbeat rounds at
// their interval; every failure names the dead rank or the silent registry;
// nothing hangs.
//
// What this does not give: a sibling that shares no connection with the
// dead rank (prefill tp0, decode tp0 in tp2 -> tp2) learns of it only
// through the registry, so while the registry is silent it goes on
// succeeding rooms whose other half failed (sglang's all-reduce of the poll
// across the tp group still fails those requests).
TEST(FaultMatrixTest, SilentRegistryDelaysNoHeartbeatAndNoDetection) {
  Matrix m = Launch(2, 2, Workload(400, 24));
  ASSERT_TRUE(m.cluster);
  Cluster& c = *m.cluster;
  WaitForProgress(c, 20);
  const int registry = c.bootstrap_index();
  const int victim = c.RankIndex(Role::kPrefill, 1);
  const int pid = c.process(victim).pid;
  // Each survivor's last progress before the registry goes silent.
  std::map<int, json> before;
  for (int i = 0; i < c.num_ranks(); ++i)
    if (i != victim && i != registry) before[i] = c.process(i).progress.value_or(json());
  ASSERT_TRUE(c.Signal(registry, SIGSTOP).ok());
  const int64_t killed_us = std::chrono::duration_cast<std::chrono::microseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
  ASSERT_TRUE(c.Signal(victim, SIGKILL).ok());
  ASSERT_TRUE(c.CollectReports(milliseconds(120000), {victim, registry}).ok());
  for (auto& [i, progress] : before) {
    const ProcessInfo& p = c.process(i);
    SCOPED_TRACE(p.name);
    ASSERT_TRUE(p.report.has_value()) << p.exit.ToString();
    const json& r = *p.report;
    EXPECT_EQ(r["nonterminal"].get<int>(), 0) << "rooms left hanging";
    EXPECT_EQ(r["corrupt_pages"].get<int>(), 0);
    EXPECT_EQ(r["finished"].get<int>(), r["requests"].get<int>());
    // Heartbeat rounds at >= half their rate (100 ms) from the last
    // progress line before the silence to the report; a ticker waiting on
    // the registry would manage one round per 2 s.
    ASSERT_TRUE(progress.contains("heartbeat_rounds")) << progress.dump();
    const double elapsed_ms =
        (r["at_us"].get<int64_t>() - progress["at_us"].get<int64_t>()) / 1000.0;
    const uint64_t rounds = r["stats_after"]["heartbeat_rounds"].get<uint64_t>() -
                            progress["heartbeat_rounds"].get<uint64_t>();
    EXPECT_GE(static_cast<double>(rounds), elapsed_ms / 100.0 / 2.0)
        << rounds << " heartbeat rounds in " << elapsed_ms << " ms";
    int64_t first_named_us = 0;
    for (const json& f : r["failures"]) {
      SCOPED_TRACE(f.dump());
      const std::string origin = f["origin"]["name"].get<std::string>();
      const std::string cause = f["cause"].get<std::string>();
      if (origin == "prefill tp1") {
        EXPECT_EQ(f["origin"]["pid"].get<int>(), pid);
        EXPECT_TRUE(cause == "peer_exited" || cause == "peer_unreachable") << cause;
        const int64_t at = f["detected_at_us"].get<int64_t>();
        if (first_named_us == 0 || at < first_named_us) first_named_us = at;
      } else {
        EXPECT_EQ(origin, "bootstrap server");
        EXPECT_EQ(cause, "registry_lost");
      }
    }
    // decode tp1 reads from prefill tp1 (tp2 -> tp2): it must name it, fast.
    if (p.name == "decode tp1") {
      ASSERT_NE(first_named_us, 0) << "decode tp1 never named the killed rank";
      EXPECT_LE(first_named_us - killed_us, 2'000'000)
          << "named " << (first_named_us - killed_us) / 1000 << " ms after the kill";
    }
  }
  ASSERT_TRUE(c.Signal(registry, SIGCONT).ok());
  c.Shutdown(milliseconds(10000));
}

TEST(FaultMatrixTest, ReportedOutOfMemoryReachesEverySiblingAndPeer) {
  std::vector<std::string> args = Workload(300, 16);
  Matrix m;
  m.options.binary = std::string(KVB_BIN_DIR) + "/kvbridge";
  m.options.prefill_tp = 2;
  m.options.decode_tp = 2;
  m.options.bootstrap = BootstrapMode::kStandalone;
  m.options.worker_args = args;
  m.options.rank_args = {{}, {"--fatal-after", "30"}, {}, {}};
  auto started = Cluster::Start(m.options);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  Cluster& c = **started;
  ASSERT_TRUE(c.CollectReports(milliseconds(120000)).ok());
  const int victim = c.RankIndex(Role::kPrefill, 1);
  // The reporting rank itself holds the record too (flag false there).
  ExpectSurvivorsReport(c, {},
                        {.origin = "prefill tp1",
                         .origin_pid = c.process(victim).pid,
                         .causes = {"local_error"},
                         .detail_has = "CUDA out of memory"});
  c.Shutdown(milliseconds(10000));
}

TEST(FaultMatrixTest, StalledTransferHitsTheDeadlineNamingPhaseAndPeer) {
  // 60 requests: after the stall each batch of 8 waits out the 1.5 s
  // deadline, so the run lasts about (60 - 20) / 8 x 1.5 s (200 took 40 s).
  std::vector<std::string> args = Workload(60, 8);
  args.insert(args.end(), {"--transfer-timeout-ms", "1500"});
  Matrix m;
  m.options.binary = std::string(KVB_BIN_DIR) + "/kvbridge";
  m.options.prefill_tp = 1;
  m.options.decode_tp = 1;
  m.options.bootstrap = BootstrapMode::kStandalone;
  m.options.worker_args = args;
  m.options.rank_args = {{"--stall-after", "20"}, {}};
  auto started = Cluster::Start(m.options);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  Cluster& c = **started;
  ASSERT_TRUE(c.CollectReports(milliseconds(150000)).ok());
  // Prefill's writes to decode tp0 never complete: the transfer deadline
  // names the phase and the peer it was writing to; decode learns the same.
  // At the stall's edge a request whose writes completed just before it may
  // have its last chunk's notice queued behind the first held batch (per
  // peer order): prefill saw it succeed, and decode, which never got the
  // notice, fails it at its own deadline naming prefill (an ASan CI run).
  ExpectSurvivorsReport(c, {},
                        {.origin = "decode tp0",
                         .causes = {"deadline_exceeded"},
                         .phase = "transferring",
                         .alt_origin = "prefill tp0",
                         .alt_detail_has = "no chunk from prefill tp0"});
  c.Shutdown(milliseconds(10000));
}

TEST(FaultMatrixTest, TwoHundredRoomsInFlightWhenARankDies) {
  Matrix m = Launch(2, 2, Workload(600, 200));
  ASSERT_TRUE(m.cluster);
  Cluster& c = *m.cluster;
  WaitForProgress(c, 10);
  const int victim = c.RankIndex(Role::kPrefill, 0);
  const int pid = c.process(victim).pid;
  ASSERT_TRUE(c.Signal(victim, SIGKILL).ok());
  ASSERT_TRUE(c.CollectReports(milliseconds(150000), {victim}).ok());
  ExpectSurvivorsReport(
      c, {victim},
      {.origin = "prefill tp0", .origin_pid = pid, .causes = {"peer_exited", "peer_unreachable"}});
  for (int i = 0; i < c.num_ranks(); ++i) {
    if (i == victim) continue;
    const json& r = *c.process(i).report;
    EXPECT_EQ(r["succeeded"].get<int>() + r["failed"].get<int>(), 600) << c.process(i).name;
  }
  c.Shutdown(milliseconds(10000));
}

// Scenario 7: a peer restarted at the same address. One rank of a prefill
// tp2 + decode tp2 pair is SIGKILLed with rooms in flight; every survivor
// names it; it is started again at the same position (same role, tp rank,
// host, bootstrap server and arguments); new requests then succeed through
// the new process on every rank and no page is corrupt.
//
// "The same address": a rank's transport address is a UCX worker address
// blob (random worker id, the process's pid, its memfd segments), new for
// every process and not pinnable, so the restarted rank comes back at the
// same registry position on the same host and bootstrap server, which is
// where its peers look it up. Stale state cannot pass unnoticed: Meta sent
// over the old endpoint, writes through the remote keys the old decode
// process handed out, or a survivor still blocking on the old process's
// failure record would fail or time out the new requests (all must
// succeed); a write into the wrong pages is a corrupt page; and every peer
// of the restarted rank reports the pid and incarnation it talks to now.
struct RestartCase {
  Role role;
  std::string name;  // of the victim
};

class FaultMatrixRestartTest : public ::testing::TestWithParam<RestartCase> {};

TEST_P(FaultMatrixRestartTest, RankRestartedAtTheSamePositionServesNewRequests) {
  const RestartCase& rc = GetParam();
  // A long plan; "hold" and "limit" cut it to two waves every rank agrees on.
  Matrix m = Launch(2, 2, Workload(4000, 24));
  ASSERT_TRUE(m.cluster);
  Cluster& c = *m.cluster;
  std::map<int, json> held;  // rank index -> its HELD line
  c.on_line = [&](int i, const std::string& line) {
    if (line.starts_with("HELD ")) held[i] = json::parse(line.substr(5));
  };
  WaitForProgress(c, 20);
  const int victim = c.RankIndex(rc.role, 1);
  ASSERT_EQ(c.process(victim).name, rc.name);
  const int old_pid = c.process(victim).pid;
  const uint64_t old_incarnation = c.process(victim).ready["incarnation"].get<uint64_t>();
  ASSERT_TRUE(c.Signal(victim, SIGKILL).ok());

  // The stream goes on until every survivor has failed requests over it.
  std::vector<int> survivors;
  for (int i = 0; i < c.num_ranks(); ++i)
    if (i != victim) survivors.push_back(i);
  Status s = c.PumpUntil(
      [&] {
        for (int i : survivors) {
          const auto& p = c.process(i).progress;
          if (!p || (*p)["failed"].get<uint64_t>() == 0) return false;
        }
        return true;
      },
      milliseconds(60000));
  ASSERT_TRUE(s.ok()) << s.ToString();
  // Wave 1 ends at one request index K on every survivor: each first holds
  // at what it admitted, then all move to the largest; the rooms a lagging
  // rank admits on the way fail at once.
  auto all_held = [&](uint64_t at) {
    for (int i : survivors)
      if (!held.count(i) || held[i]["admitted"].get<uint64_t>() < at) return false;
    return true;
  };
  for (int i : survivors) ASSERT_TRUE(c.WriteLine(i, "hold 0").ok());
  s = c.PumpUntil([&] { return all_held(0); }, milliseconds(60000));
  ASSERT_TRUE(s.ok()) << s.ToString();
  uint64_t k = 0;
  for (int i : survivors) k = std::max(k, held[i]["admitted"].get<uint64_t>());
  for (int i : survivors) {
    if (held[i]["admitted"].get<uint64_t>() == k) continue;
    held.erase(i);
    ASSERT_TRUE(c.WriteLine(i, "hold " + std::to_string(k)).ok());
  }
  s = c.PumpUntil([&] { return all_held(k); }, milliseconds(60000));
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (int i : survivors) EXPECT_EQ(held[i]["admitted"].get<uint64_t>(), k) << c.process(i).name;

  // The same position, a new process; it joins the stream at request K.
  s = c.Restart(victim, {"--first-request", std::to_string(k)}, milliseconds(60000));
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(c.history(victim).size(), 1u);
  EXPECT_EQ(c.history(victim)[0].pid, old_pid);
  EXPECT_EQ(c.history(victim)[0].exit.signal, SIGKILL);
  const int new_pid = c.process(victim).pid;
  const uint64_t new_incarnation = c.process(victim).ready["incarnation"].get<uint64_t>();
  EXPECT_NE(new_pid, old_pid);
  EXPECT_NE(new_incarnation, old_incarnation);
  EXPECT_EQ(c.process(victim).ready["name"], rc.name);
  EXPECT_EQ(c.process(victim).ready["host"], c.history(victim)[0].ready["host"]);

  // Wave 2: requests K+1..M on every rank, the restarted one included,
  // straight away (no waiting for the survivors to notice the restart).
  constexpr uint64_t kWave2 = 100;
  const uint64_t limit = k + kWave2;
  ASSERT_TRUE(c.WriteLine(victim, "limit " + std::to_string(limit)).ok());
  for (int i : survivors) ASSERT_TRUE(c.WriteLine(i, "limit " + std::to_string(limit)).ok());
  s = c.CollectReports(milliseconds(120000));
  ASSERT_TRUE(s.ok()) << s.ToString();

  // Wave 1's failures all name the killed process; every survivor had some.
  ExpectSurvivorsReport(
      c, {victim},
      {.origin = rc.name, .origin_pid = old_pid, .causes = {"peer_exited", "peer_unreachable"}});
  for (int i = 0; i < c.num_ranks(); ++i) {
    const ProcessInfo& p = c.process(i);
    SCOPED_TRACE(p.name);
    ASSERT_TRUE(p.report.has_value()) << p.exit.ToString();
    const json& r = *p.report;
    // Every request of wave 2 (rooms K+1..M) succeeded, on every rank.
    for (const json& f : r["failures"])
      EXPECT_LE(f["room"].get<uint64_t>(), k) << "a new request failed: " << f.dump();
    EXPECT_GE(r["succeeded"].get<uint64_t>(), kWave2);
    EXPECT_EQ(r["corrupt_pages"].get<int>(), 0);
    EXPECT_EQ(r["nonterminal"].get<int>(), 0);
  }
  const json& restarted = *c.process(victim).report;
  EXPECT_EQ(restarted["requests"].get<uint64_t>(), kWave2);
  EXPECT_EQ(restarted["succeeded"].get<uint64_t>(), kWave2);
  EXPECT_EQ(restarted["rank"]["pid"].get<int>(), new_pid);
  // The ranks that exchange data with it talk to the new process: their
  // peer at its position is the new incarnation, never the old endpoint.
  int peers_of_victim = 0;
  for (int i : survivors) {
    const ProcessInfo& p = c.process(i);
    for (const json& peer : (*p.report)["peers"]) {
      if (peer["name"] != rc.name) continue;
      ++peers_of_victim;
      EXPECT_EQ(peer["pid"].get<int>(), new_pid) << p.name << ": " << peer.dump();
      EXPECT_EQ(peer["incarnation"].get<uint64_t>(), new_incarnation) << p.name;
      EXPECT_FALSE(peer["failed"].get<bool>()) << p.name;
    }
  }
  EXPECT_GE(peers_of_victim, 1) << "no survivor exchanges data with " << rc.name;
  c.Shutdown(milliseconds(10000));
}

INSTANTIATE_TEST_SUITE_P(Victim, FaultMatrixRestartTest,
                         ::testing::Values(RestartCase{Role::kPrefill, "prefill tp1"},
                                           RestartCase{Role::kDecode, "decode tp1"}),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           std::replace(n.begin(), n.end(), ' ', '_');
                           return n;
                         });

}  // namespace
}  // namespace kvbridge::tools
