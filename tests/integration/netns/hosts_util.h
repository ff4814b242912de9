// Worker clusters on hosts (tools/hosts.h) for the multi-process tests:
// host 0 runs the standalone bootstrap server, ranks go where the test says.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "tools/cluster.h"
#include "tools/hosts.h"

// Skips the test, saying why, where hosts cannot be made (not root, no ip).
#define KVB_SKIP_WITHOUT_HOSTS()                                                   \
  do {                                                                             \
    if (std::string why = ::kvbridge::tools::HostNet::Unsupported(); !why.empty()) \
      GTEST_SKIP() << "hosts in network namespaces: " << why;                      \
  } while (0)

namespace kvbridge::tools {

struct HostsLayout {
  int prefill_tp = 1;
  int decode_tp = 1;
  // The host of every rank (indexed like Cluster ranks); host 0 is the
  // registry's, so ranks go on 1, 2, ...
  std::vector<int> rank_hosts;
  // The bootstrap server is a stand-in for sglang's own (ClusterOptions).
  bool sglang_server = false;
};

struct HostsCluster {
  // Declared first: destroyed last, after every process is gone.
  std::unique_ptr<HostNet> net;
  std::unique_ptr<Cluster> cluster;
  std::vector<int> host_of;  // per rank index
  std::string log_dir;
  std::string error;  // why cluster is null
};

// The fault-matrix workload for hosts: paced, same-host paths requested
// (--shm; they cannot work between hosts), 100 ms heartbeats, 10 misses.
std::vector<std::string> HostWorkload(int requests, int concurrency);

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KVB_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define KVB_TEST_SANITIZED 1
#endif
#endif
#ifdef KVB_TEST_SANITIZED
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

// Heartbeat misses for the runs that must see no false failure on a lossy,
// slow link: 16 (1.6 s), and 20 under a sanitizer. A limit must outlast a
// segment lost three times in a row, which at 5% loss each way happens to
// some segment in about one run in a hundred: TCP retransmits it after
// 0.2, 0.4 and 0.8 s (Linux's minimum RTO, doubling), so the stream is
// silent for 1.4 s. At the hosts' 10 (1 s), the normal build failed a
// healthy decode rank as "silent for 1.08 s" in one clean-clone run of
// LossyLinkTest.FivePercentLossFailsNoRequest (and passed 12 reruns). ASan
// and TSan slow every process of the run 2-10x (the userspace link-delay
// forwarder too), and on two cores that alone left healthy ranks silent
// for 1.0-1.1 s in 3 of 8 ASan runs. The detection tests keep 10 in every
// build: a partition is named within 2 s.
inline constexpr int kLossyLinkMisses = kSanitized ? 20 : 16;

// HostWorkload with kLossyLinkMisses.
std::vector<std::string> LossyLinkWorkload(int requests, int concurrency);

// Creates the hosts and starts the cluster; on failure `error` says why.
HostsCluster StartOnHosts(const HostsLayout& layout, std::vector<std::string> worker_args);

// Starts one more cluster on existing hosts (its own bootstrap server on
// `bootstrap_host`), logs under `log_dir` (created if missing).
Result<std::unique_ptr<Cluster>> StartCluster(const HostNet& net, const HostsLayout& layout,
                                              int bootstrap_host,
                                              std::vector<std::string> worker_args,
                                              const std::string& log_dir);

// A new directory under /tmp for logs ("" if it cannot be made).
std::string NewLogDir();

// Wall-clock µs since the epoch (the clock of failure records).
int64_t WallMicros();

// Every "connected to ... via X" in the log of process `index`: X, e.g.
// "ucx-rndv over tcp".
std::vector<std::string> ConnectionPaths(const std::string& log_dir, const Cluster& c, int index);

}  // namespace kvbridge::tools
