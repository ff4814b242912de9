#include "tests/integration/netns/hosts_util.h"

#include <stdlib.h>

#include <algorithm>
#include <fstream>
#include <regex>

namespace kvbridge::tools {

std::vector<std::string> HostWorkload(int requests, int concurrency) {
  return {"--layers",
          "2",
          "--heads",
          "8",
          "--head-dim",
          "16",
          "--page-size",
          "16",
          "--min-tokens",
          "256",
          "--max-tokens",
          "1024",
          "--chunk-tokens",
          "512",
          "--requests",
          std::to_string(requests),
          "--concurrency",
          std::to_string(concurrency),
          "--pool-pages",
          "8192",
          "--heartbeat-ms",
          "100",
          "--heartbeat-misses",
          "10",
          "--progress-ms",
          "100",
          "--deadline-s",
          "90",
          "--quiesce-timeout-ms",
          "5000",
          "--rate",
          "100",
          "--shm"};
}

HostsCluster StartOnHosts(const HostsLayout& layout, std::vector<std::string> worker_args) {
  HostsCluster hc;
  hc.host_of = layout.rank_hosts;
  const int ranks = layout.prefill_tp + layout.decode_tp;
  if (static_cast<int>(hc.host_of.size()) != ranks) {
    hc.error = "rank_hosts names " + std::to_string(hc.host_of.size()) + " hosts for " +
               std::to_string(ranks) + " ranks";
    return hc;
  }
  const int hosts = *std::max_element(hc.host_of.begin(), hc.host_of.end()) + 1;
  auto net = HostNet::Create(hosts);
  if (!net.ok()) {
    hc.error = net.status().ToString();
    return hc;
  }
  hc.net = std::move(net).value();
  char dir[] = "/tmp/kvb-hosts-XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    hc.error = "mkdtemp failed";
    return hc;
  }
  hc.log_dir = dir;
  ClusterOptions o;
  o.binary = std::string(KVB_BIN_DIR) + "/kvbridge";
  o.prefill_tp = layout.prefill_tp;
  o.decode_tp = layout.decode_tp;
  o.bootstrap = BootstrapMode::kStandalone;
  o.bootstrap_host = hc.net->address(0);
  o.bootstrap_wrap = hc.net->Command(0);
  for (int h : hc.host_of) o.rank_wrap.push_back(hc.net->Command(h));
  o.worker_args = std::move(worker_args);
  o.env = HostNet::Env();
  o.env.push_back(getenv("KVB_HOSTS_DEBUG") ? "KVBRIDGE_LOG_LEVEL=debug"
                                            : "KVBRIDGE_LOG_LEVEL=info");
  o.log_dir = hc.log_dir;
  auto c = Cluster::Start(o);
  if (!c.ok()) {
    hc.error = c.status().ToString() + " (logs in " + hc.log_dir + ")";
    return hc;
  }
  hc.cluster = std::move(c).value();
  return hc;
}

std::vector<std::string> ConnectionPaths(const HostsCluster& hc, int index) {
  std::vector<std::string> out;
  static const std::regex kVia(R"(\] connected to .* via (.*\S)\s*$)");
  std::string name = hc.cluster->process(index).name;
  std::replace(name.begin(), name.end(), ' ', '-');
  std::ifstream in(hc.log_dir + "/" + name + ".log");
  std::string line;
  std::smatch m;
  while (std::getline(in, line))
    if (std::regex_search(line, m, kVia)) out.push_back(m[1]);
  return out;
}

}  // namespace kvbridge::tools
