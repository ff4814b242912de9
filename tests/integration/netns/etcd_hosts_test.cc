// A 3-member etcd across three hosts (tools/hosts.h): each member in a host
// of its own, prefill tp 2 on a fourth host and decode tp 2 on a fifth,
// finding each other only through etcd over the hosts' network. The etcd
// leader is killed mid-run: no registration and no failure record is lost
// (records published during the election get the next sequence numbers),
// no request fails, and the demo does the same with its etcd on its hosts.
// Skipped without root or without /usr/bin/etcd (etcd-server).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "control/auth.h"
#include "control/etcd_registry.h"
#include "tests/integration/etcd/leader_check.h"
#include "tests/integration/netns/hosts_util.h"
#include "tools/etcd_cluster.h"

namespace kvbridge::tools {
namespace {

using internal::EtcdRegistryClient;
using nlohmann::json;
using std::chrono::milliseconds;

#define KVB_SKIP_WITHOUT_ETCD()                                                           \
  do {                                                                                    \
    KVB_SKIP_WITHOUT_HOSTS();                                                             \
    if (!EtcdCluster::Available()) GTEST_SKIP() << "/usr/bin/etcd missing (etcd-server)"; \
  } while (0)

// While it lives, this thread is in host `h`'s network namespace (the
// watcher's sockets and threads are made there: the hosts' addresses are
// reachable only from inside their network).
class InHostNetwork {
 public:
  InHostNetwork(const HostNet& net, int h) {
    self_ = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    int fd = open(("/run/netns/" + net.netns(h)).c_str(), O_RDONLY | O_CLOEXEC);
    joined_ = self_ >= 0 && fd >= 0 && setns(fd, CLONE_NEWNET) == 0;
    if (fd >= 0) close(fd);
  }
  ~InHostNetwork() {
    if (joined_ && setns(self_, CLONE_NEWNET) != 0) std::perror("setns back");
    if (self_ >= 0) close(self_);
  }
  bool joined() const { return joined_; }

 private:
  int self_ = -1;
  bool joined_ = false;
};

TEST(EtcdOnHostsTest, LeaderKilledMidRunLosesNothingAndFailsNoRequest) {
  KVB_SKIP_WITHOUT_ETCD();
  auto created = HostNet::Create(5);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  HostNet& net = **created;
  const std::string logs = NewLogDir();
  EtcdClusterOptions eo;
  eo.members = 3;
  eo.net = &net;
  eo.member_hosts = {0, 1, 2};
  eo.log_dir = logs;
  auto etcd = EtcdCluster::Start(eo);
  ASSERT_TRUE(etcd.ok()) << etcd.status().ToString() << " (logs in " << logs << ")";
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE((*etcd)->endpoint(i).starts_with(net.address(i) + ":")) << (*etcd)->endpoint(i);
  const std::string url = (*etcd)->Url("hosts");

  // The ranks: prefill on host 3, decode on host 4, etcd as the registry.
  ClusterOptions o;
  o.binary = std::string(KVB_BIN_DIR) + "/kvbridge";
  o.prefill_tp = 2;
  o.decode_tp = 2;
  o.bootstrap = BootstrapMode::kEmbedded;  // none is started: the registry is etcd
  o.worker_args = HostWorkload(300, 8);
  o.worker_args.insert(o.worker_args.end(), {"--registry", url});
  for (int h : {3, 3, 4, 4}) o.rank_wrap.push_back(net.Command(h));
  o.env = HostNet::Env();
  o.env.push_back("KVBRIDGE_LOG_LEVEL=info");
  o.log_dir = logs;
  auto started = Cluster::Start(o);
  ASSERT_TRUE(started.ok()) << started.status().ToString() << " (logs in " << logs << ")";
  Cluster& c = **started;

  InHostNetwork here(net, 0);
  ASSERT_TRUE(here.joined());
  auto parsed = internal::ParseEtcdRegistryUrl(url);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  parsed->auth_token = internal::EnsureAuthTokenInEnvironment();  // the cluster's secret
  auto watcher_or = EtcdRegistryClient::Create(*parsed);
  ASSERT_TRUE(watcher_or.ok()) << watcher_or.status().ToString();
  EtcdRegistryClient& watcher = **watcher_or;
  SCOPED_TRACE("logs in " + logs);
  etcd_check::LeaderKill kill;
  etcd_check::KillLeaderMidRun(c, **etcd, watcher, 300, &kill);
  std::printf("ETCD on hosts: killed leader member %d (host %s), new leader member %d\n",
              kill.killed, kill.killed >= 0 ? net.hostname(kill.killed).c_str() : "?", kill.next);
  c.Shutdown(milliseconds(10000));
}

// `kvbridge demo --hosts 3 --registry etcd --fault kill-etcd-leader`: its
// three etcd members on the three hosts, the leader killed at the 10th
// request; every request succeeds, every page verified.
TEST(EtcdOnHostsTest, DemoOnHostsFinishesWhenTheEtcdLeaderIsKilled) {
  KVB_SKIP_WITHOUT_ETCD();
  const std::string cmd = std::string(KVB_BIN_DIR) +
                          "/kvbridge demo --json --hosts 3 --registry etcd "
                          "--fault kill-etcd-leader@10 --requests 80 --layers 4 --head-dim 64 "
                          "--max-tokens 1024 --timeout 90 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  const int status = pclose(f);
  json j = json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << cmd << "\nstdout is not one JSON object:\n" << out;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << j.dump(2);
  EXPECT_TRUE(j["ok"].get<bool>()) << j["problems"].dump();
  EXPECT_EQ(j["succeeded"], 80);
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["corrupt_pages"], 0);
  EXPECT_GT(j["verified_pages"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["data_path"], "tcp");
  // Three members, each at a host's address (10.77.S.1..3), none on loopback.
  const std::string registry = j["registry"].get<std::string>();
  EXPECT_TRUE(registry.starts_with("etcd://10.77.")) << registry;
  EXPECT_EQ(registry.find("127.0.0.1"), std::string::npos) << registry;
  EXPECT_EQ(std::count(registry.begin(), registry.end(), ','), 2) << registry;
  EXPECT_TRUE(j["fault"]["fired"].get<bool>());
  EXPECT_TRUE(j["fault"]["victim"].get<std::string>().starts_with("etcd member "))
      << j["fault"].dump();
  EXPECT_GT(j["fault"]["pid"].get<int>(), 0);
}

}  // namespace
}  // namespace kvbridge::tools
