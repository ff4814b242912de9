#include "tests/integration/netns/hosts_util.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
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

std::vector<std::string> LossyLinkWorkload(int requests, int concurrency) {
  std::vector<std::string> args = HostWorkload(requests, concurrency);
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == "--heartbeat-misses") args[i + 1] = std::to_string(kLossyLinkMisses);
  return args;
}

std::string NewLogDir() {
  char dir[] = "/tmp/kvb-hosts-XXXXXX";
  return mkdtemp(dir) == nullptr ? std::string() : std::string(dir);
}

int64_t WallMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Result<std::unique_ptr<Cluster>> StartCluster(const HostNet& net, const HostsLayout& layout,
                                              int bootstrap_host,
                                              std::vector<std::string> worker_args,
                                              const std::string& log_dir) {
  const int ranks = layout.prefill_tp + layout.decode_tp;
  if (static_cast<int>(layout.rank_hosts.size()) != ranks)
    return InvalidArgumentError("rank_hosts names " + std::to_string(layout.rank_hosts.size()) +
                                " hosts for " + std::to_string(ranks) + " ranks");
  mkdir(log_dir.c_str(), 0755);
  ClusterOptions o;
  o.binary = std::string(KVB_BIN_DIR) + "/kvbridge";
  o.prefill_tp = layout.prefill_tp;
  o.decode_tp = layout.decode_tp;
  o.bootstrap = BootstrapMode::kStandalone;
  o.bootstrap_host = net.address(bootstrap_host);
  o.bootstrap_wrap = net.Command(bootstrap_host);
  o.sglang_server = layout.sglang_server;
  for (int h : layout.rank_hosts) {
    o.rank_wrap.push_back(net.Command(h));
    // Where its rank endpoint serves it (sglang's server lists only that).
    o.rank_args.push_back({"--advertise-host", net.address(h)});
  }
  o.worker_args = std::move(worker_args);
  o.env = HostNet::Env();
  o.env.push_back(getenv("KVB_HOSTS_DEBUG") ? "KVBRIDGE_LOG_LEVEL=debug"
                                            : "KVBRIDGE_LOG_LEVEL=info");
  o.log_dir = log_dir;
  auto c = Cluster::Start(o);
  if (!c.ok())
    return Status(c.status().code(), c.status().message() + " (logs in " + log_dir + ")");
  return c;
}

HostsCluster StartOnHosts(const HostsLayout& layout, std::vector<std::string> worker_args) {
  HostsCluster hc;
  hc.host_of = layout.rank_hosts;
  if (hc.host_of.empty()) {
    hc.error = "no rank hosts";
    return hc;
  }
  const int hosts = *std::max_element(hc.host_of.begin(), hc.host_of.end()) + 1;
  auto net = HostNet::Create(hosts);
  if (!net.ok()) {
    hc.error = net.status().ToString();
    return hc;
  }
  hc.net = std::move(net).value();
  hc.log_dir = NewLogDir();
  auto c = StartCluster(*hc.net, layout, 0, std::move(worker_args), hc.log_dir);
  if (!c.ok()) {
    hc.error = c.status().ToString();
    return hc;
  }
  hc.cluster = std::move(c).value();
  return hc;
}

std::vector<std::string> ConnectionPaths(const std::string& log_dir, const Cluster& c, int index) {
  std::vector<std::string> out;
  // "connected to X via PATH[ over WIRE][: mapped N regions (...)]".
  static const std::regex kVia(R"(\] connected to .* via ([^:]*[^:\s])(?::.*)?\s*$)");
  std::string name = c.process(index).name;
  std::replace(name.begin(), name.end(), ' ', '-');
  std::ifstream in(log_dir + "/" + name + ".log");
  std::string line;
  std::smatch m;
  while (std::getline(in, line))
    if (std::regex_search(line, m, kVia)) out.push_back(m[1]);
  return out;
}

}  // namespace kvbridge::tools
