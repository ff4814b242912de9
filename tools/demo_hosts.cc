#include "tools/demo_hosts.h"

namespace kvbridge::tools {

bool IsNetworkFault(const std::string& kind) {
  return kind == "partition-prefill" || kind == "partition-decode" || kind == "lossy-link";
}

void PlaceRanks(const HostNet& net, int prefill_hosts, int decode_hosts, ClusterOptions& co) {
  co.binary = ResolvedBinary(co.binary);
  for (int i = 0; i < co.prefill_tp; ++i) co.rank_wrap.push_back(net.Command(i % prefill_hosts));
  for (int i = 0; i < co.decode_tp; ++i)
    co.rank_wrap.push_back(net.Command(prefill_hosts + i % decode_hosts));
  co.bootstrap_wrap = net.Command(0);
  co.bootstrap_host = net.address(0);
  for (const std::string& e : HostNet::Env()) co.env.push_back(e);
}

Result<DemoHosts> PlaceOnHosts(const DemoFlags& f, const std::string& fault_kind, int victim_rank,
                               const std::string& log_dir, ClusterOptions& co) {
  const bool partition = fault_kind.starts_with("partition-");
  // A partitioned victim needs a host of its own, and the others two: the
  // registry's with prefill, and decode's.
  if (partition && f.hosts < 3)
    return InvalidArgumentError("--fault " + fault_kind + " needs --hosts 3 or more (" +
                                std::to_string(f.hosts) +
                                " given): the victim rank gets a host of its own");
  DemoHosts d;
  KVB_ASSIGN_OR_RETURN(d.net, HostNet::Create(f.hosts));
  const int shared = partition ? f.hosts - 1 : f.hosts;  // hosts the other ranks share
  const int prefill_hosts = shared / 2;
  const int decode_hosts = shared - prefill_hosts;
  const HostNet& net = *d.net;
  PlaceRanks(net, prefill_hosts, decode_hosts, co);
  if (partition) {
    d.fault_host = f.hosts - 1;
    co.rank_wrap.at(victim_rank) = net.Command(d.fault_host);
  }
  if (fault_kind == "lossy-link") {
    // The last decode rank's host: every byte to it crosses the link.
    d.fault_host = prefill_hosts + (f.decode_tp - 1) % decode_hosts;
    KVB_RETURN_IF_ERROR(d.net->Lossy(d.fault_host, kLossyLinkPercent));
    KVB_RETURN_IF_ERROR(
        d.net->Delay(d.fault_host, kLossyLinkDelayMs, co.binary, log_dir + "/link-delay.log"));
  }
  return d;
}

bool PartitionHealDue(const Cluster& c, int victim, double since) {
  if (since >= 10.0) return true;
  if (since < 2.0) return false;
  for (int i = 0; i < c.num_ranks(); ++i) {
    const ProcessInfo& p = c.process(i);
    const nlohmann::json* j = p.report ? &*p.report : p.progress ? &*p.progress : nullptr;
    if (i != victim && j != nullptr && j->value("failed", 0) > 0) return true;
  }
  return false;
}

}  // namespace kvbridge::tools
