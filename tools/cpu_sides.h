// The two sides of a benchmark on one machine, each on CPUs of its own, as
// prefill and decode are on two machines.
//
// Why (docs/benchmarks.md, session 21, "two busy threads on one CPU"): on
// the 2-vCPU test box, a UCX-over-TCP sender and receiver left to the
// scheduler run slow in about two runs of five (raw transport 1.5-1.9 GB/s
// instead of 4-5), so a ratio of two runs was a coin toss. With the sender
// on one CPU and the receiver on the other, 7 raw runs of 7 were fast. The
// request path still has slow runs when pinned: a second cause, not found.
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
