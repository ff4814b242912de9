// Ranks on different "hosts" (tools/hosts.h: network, UTS, PID and mount
// namespaces joined by a bridge): what a rank on one host can see of
// another, and that requests between hosts move every page over UCX TCP.
// Needs root and iproute2; skips with the reason otherwise.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/integration/netns/hosts_util.h"

namespace kvbridge::tools {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

TEST(HostsTest, FixtureHostsAreIsolatedFromEachOther) {
  KVB_SKIP_WITHOUT_HOSTS();
  auto net = HostNet::Create(2);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  HostNet& n = **net;
  // Each host has its own hostname and PID namespace (the shell's parent,
  // nsenter, is outside it: the shell sees a parent pid of 0), and its own
  // /dev/shm: a file made on host 0 is not there on host 1.
  auto on = [&](int h, const std::string& script) {
    std::vector<std::string> argv = n.Command(h);
    argv.insert(argv.end(), {"/bin/sh", "-c", script});
    return RunTool(argv);
  };
  ASSERT_TRUE(on(0, "test \"$(cat /proc/sys/kernel/hostname)\" = " + n.hostname(0)).ok());
  ASSERT_TRUE(on(1, "test \"$(cat /proc/sys/kernel/hostname)\" = " + n.hostname(1)).ok());
  ASSERT_TRUE(on(0, "touch /dev/shm/kvb-probe && test -e /dev/shm/kvb-probe").ok());
  Status other = on(1, "test ! -e /dev/shm/kvb-probe");
  EXPECT_TRUE(other.ok()) << other.ToString();
  // Host 1 sees one init (a sleep, its own, as pid 1); the machine has one
  // per host.
  Status procs = on(1,
                    "grep -q '^sleep$' /proc/1/comm && "
                    "test \"$(grep -l '^sleep$' /proc/[0-9]*/comm | wc -l)\" = 1");
  EXPECT_TRUE(procs.ok()) << procs.ToString();
}

TEST(HostsTest, PrefillAndDecodeOnTwoHostsMoveEveryPageOverTcp) {
  KVB_SKIP_WITHOUT_HOSTS();
  HostsCluster hc = StartOnHosts({.prefill_tp = 2, .decode_tp = 2, .rank_hosts = {1, 1, 2, 2}},
                                 HostWorkload(120, 8));
  ASSERT_TRUE(hc.cluster) << hc.error;
  Cluster& c = *hc.cluster;
  ASSERT_TRUE(c.CollectReports(milliseconds(120000)).ok());
  std::set<std::string> hosts_seen;
  for (int i = 0; i < c.num_ranks(); ++i) {
    const ProcessInfo& p = c.process(i);
    SCOPED_TRACE(p.name);
    ASSERT_TRUE(p.report.has_value()) << p.exit.ToString();
    const json& r = *p.report;
    EXPECT_EQ(r["succeeded"].get<int>(), 120);
    EXPECT_EQ(r["corrupt_pages"].get<int>(), 0);
    EXPECT_EQ(r["nonterminal"].get<int>(), 0);
    if (p.role == Role::kDecode) {
      EXPECT_GT(r["verified_pages"].get<uint64_t>(), 0u);
    }
    // The rank names its host's hostname, and its pid is the one of its
    // host's PID namespace (not the launcher's view).
    EXPECT_EQ(p.ready["host"].get<std::string>(), hc.net->hostname(hc.host_of[i]));
    EXPECT_EQ(r["rank"]["pid"].get<int>(), p.own_pid);
    EXPECT_NE(p.own_pid, p.pid);
    hosts_seen.insert(p.ready["host"].get<std::string>());
  }
  EXPECT_EQ(hosts_seen.size(), 2u);
  // Every connection between prefill and decode runs UCX over TCP: no
  // same-host path was possible, though every worker asked for one (--shm).
  // (Decode writes nothing, so its side of a connection has no path: "?".)
  for (int i = 0; i < c.prefill_ranks(); ++i) {
    std::vector<std::string> paths = ConnectionPaths(hc.log_dir, c, i);
    ASSERT_FALSE(paths.empty()) << c.process(i).name;
    for (const std::string& p : paths) EXPECT_EQ(p, "ucx-rndv over tcp") << c.process(i).name;
  }
  c.Shutdown(milliseconds(10000));
}

}  // namespace
}  // namespace kvbridge::tools
