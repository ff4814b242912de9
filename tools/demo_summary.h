// The demo's flags and its verdict: the summary object (what --json prints)
// built from the workers' reports, and its human form.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "tools/cluster.h"
#include "tools/demo.h"

namespace kvbridge::tools {

struct DemoFlags {
  // Shape of the run. The model layout defaults to the benchmark's (a
  // Llama-8B-like model: 32 layers, 8 kv heads x 128 x 2 bytes, 16-token
  // pages); about 4.5 GiB of pools over four ranks.
  int requests = 64;
  double duration_s = 0;
  int prefill_tp = 2;
  int decode_tp = 2;
  // Ranks on this many hosts in network namespaces (tools/hosts.h; root);
  // 0 = all on this host.
  int hosts = 0;
  bool mla = false;
  int layers = 32;
  int heads = 8;
  int head_dim = 128;
  bool head_dim_set = false;  // --mla defaults to 576 unless given
  int page_size = 16;
  int min_tokens = 16;
  int max_tokens = 2048;
  int chunk_tokens = 512;
  int concurrency = 8;
  int pool_pages = 0;  // 0 = concurrency x largest request + slack
  uint32_t seed = 1;
  std::string fault;
  bool json = false;
  bool ucx_only = false;
  std::string ucx_tls;
  int heartbeat_ms = 100;
  // Silent heartbeats before a peer is failed; 0 = 5 on one host, 10 with
  // --hosts: over TCP a lost segment waits >= 200 ms for retransmission and
  // each further loss doubles that, so on a lossy link a live peer can be
  // silent for over 0.5 s (the netns tests use 10 too).
  int heartbeat_misses = 0;
  // Bootstrapping / waiting deadline per request: bounds a fault run whose
  // victim will never answer (the library default is 30 s).
  int phase_timeout_ms = 15000;
  int timeout_s = 120;
  std::string log_dir;
  std::string binary = "/proc/self/exe";
  // The cluster registry: "" (a bootstrap server process), "etcd" (an etcd
  // the demo starts: 3 members with --fault kill-etcd-leader, else 1) or
  // "etcd://HOST:PORT[,...][/NAMESPACE]" (an existing cluster).
  std::string registry;
  std::vector<std::string> worker_args;
};

struct DemoRun {
  DemoFlags flags;
  FaultSpec fault;
  bool fault_fired = false;
  int victim = -1;           // process index
  int64_t fault_at_us = 0;   // wall clock µs; 0 = unknown (oom: from records)
  double seconds = 0;        // traffic time
  double start_seconds = 0;  // starting the processes (pools allocated and touched)
  // Single-thread memcpy of page-sized pieces on this box, measured just
  // before the processes start and just after they stop (0 = not measured).
  double memcpy_gbps_before = 0, memcpy_gbps_after = 0;
  std::string log_dir;
  std::vector<std::string> problems;  // found by the driver (hangs)
  std::string registry;               // what the ranks used (ManagerOptions::registry)
  // kill-etcd-leader: the member killed ("etcd member 1") and its pid.
  std::string etcd_victim;
  int etcd_victim_pid = -1;
  // Network faults (--hosts): the host cut off (partition-*) or whose link
  // is lossy and slow (lossy-link).
  std::string fault_host;
};

// What `process`'s log (log_dir/"decode-tp1.log" for "decode tp1") says
// about how it ended, for a problem line: a sanitizer's report from its
// first line, 20 lines (the stack names the defect; the report's last line
// only counts bytes), else the log's last 3 lines; joined by " | ", every
// byte outside printable ASCII as '?' (it goes into JSON), at most 3,000
// bytes. "" when the log is empty or missing.
std::string LogExcerpt(const std::string& log_dir, const std::string& process);

// One line on what is about to run.
std::string DescribeLayout(const DemoFlags& flags, const std::string& log_dir);

// The summary object: requests, succeeded, failed, bytes, gbps, p50_us,
// p99_us, verified_pages, corrupt_pages, data_path, ranks, ok, problems, and
// for fault runs fault {kind, victim, pid, ...} and reports [...] (one per
// rank that reported, victim flagged): the first failure naming the victim
// among the rank's rooms ("source": "room"), else the rank's latest known
// rank failure ("source": "rank"), with detection_ms = its detected_at minus
// the time of the fault. Also the time account: decode_window_seconds (the
// slowest decode rank's first SendMetadata to last Success), window_gbps,
// fill_seconds / verify_seconds (the busiest prefill / decode rank's thread),
// memcpy_gbps and ratio_to_memcpy (end-to-end rate over memcpy).
nlohmann::json Summarize(const Cluster& cluster, const DemoRun& run);

void PrintSummary(std::ostream& out, const nlohmann::json& summary);

}  // namespace kvbridge::tools
