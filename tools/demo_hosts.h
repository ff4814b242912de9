// `kvbridge demo --hosts N`: where the demo's processes go on hosts in
// network namespaces (tools/hosts.h), and the network faults that need
// hosts: partition-prefill / partition-decode (the victim's host is cut off
// both ways mid-run, then healed) and lossy-link (5% loss both ways and
// 20 ms delay each way on one host's link for the whole run).
#pragma once

#include <memory>
#include <string>

#include "tools/cluster.h"
#include "tools/demo_summary.h"
#include "tools/hosts.h"

namespace kvbridge::tools {

// partition-prefill, partition-decode, lossy-link.
bool IsNetworkFault(const std::string& kind);

// lossy-link's link: what it does to every packet.
constexpr int kLossyLinkPercent = 5;
constexpr int kLossyLinkDelayMs = 20;

struct DemoHosts {
  std::unique_ptr<HostNet> net;
  // partition-*: the host the victim rank has to itself; lossy-link: the
  // host whose link is lossy and slow; -1 without a network fault.
  int fault_host = -1;
};

// Places the processes of `co` on `net`'s hosts (the code `demo --hosts`
// and `bench requests --hosts` share): prefill tp i on host
// i % prefill_hosts, decode tp i on host prefill_hosts + i % decode_hosts,
// the bootstrap server on host 0 (standalone: wrapped there; embedded: it is
// prefill tp0, on host 0), every process with HostNet::Env(). Resolves a
// /proc/self/exe binary (through nsenter it would name nsenter).
// Preconditions: prefill_hosts, decode_hosts >= 1, their sum <= net.size().
void PlaceRanks(const HostNet& net, int prefill_hosts, int decode_hosts, ClusterOptions& co);

// Creates f.hosts hosts and sets the wrappers, bootstrap address and
// environment in `co`: prefill ranks on the first half of the hosts, decode
// ranks on the rest, the bootstrap server on host 0. With a partition
// fault the victim rank (`victim_rank`, a rank index) gets the last host to
// itself and the others share the rest, so cutting it cuts off nothing
// else; lossy-link applies the loss and delay at once to the link of the
// last decode rank's host (its delayer logs to `log_dir`/link-delay.log). InvalidArgument
// when there are too few hosts for the fault; errors of HostNet.
Result<DemoHosts> PlaceOnHosts(const DemoFlags& f, const std::string& fault_kind, int victim_rank,
                               const std::string& log_dir, ClusterOptions& co);

// partition-*: whether to heal `since` seconds after the cut: once a
// survivor (a rank other than process `victim`) has failed a request over
// it and every survivor had the 2 s it has to detect it; at 10 s anyway.
bool PartitionHealDue(const Cluster& c, int victim, double since);

}  // namespace kvbridge::tools
