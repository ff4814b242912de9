// The two sides of a benchmark on one machine, each on CPUs of its own, as
// prefill and decode are on two machines.
//
// Why (docs/benchmarks.md, "Two busy threads on one CPU"): on the 2-vCPU
// test box, a UCX-over-TCP sender and its receiver left to the scheduler
// share one CPU in about two runs of five (a receiver woken by the data
// goes to its waker's CPU): the raw transport then moves 1.5-1.9 GB/s
// instead of 4-5, the request path alike, and a ratio of two runs is a coin
// toss. Pinned, each side on its own CPU, 7 runs of 7 gave 4.1-5.2 GB/s.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace kvbridge::tools {

// CPU lists as taskset takes them ("0", "2,3").
struct CpuSides {
  std::string first;   // the sending side: prefill, the raw initiator
  std::string second;  // the receiving side: decode, the raw target
};

// `cpus` (in any order) split in two halves, the lower numbers first; none
// with fewer than two CPUs (nothing to split) or a negative number.
std::optional<CpuSides> SplitCpus(std::vector<int> cpus);

// The CPUs this process may run on (sched_getaffinity); empty when unknown.
std::vector<int> AllowedCpus();

// The argv prefix that runs a command on `cpus` (util-linux's taskset,
// which execs the command: the process keeps its pid).
std::vector<std::string> PinCommand(const std::string& cpus);

}  // namespace kvbridge::tools
