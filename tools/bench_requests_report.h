// The figures `kvbridge bench requests` measures and its two reports (text
// and --json). Internal to tools/: bench_requests.cc measures, this prints.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tools/cpu_sides.h"

namespace kvbridge::tools::bench_requests {

struct RequestsFlags {
  std::string path = "shm";  // shm | tcp
  int hosts = 0;             // 0 = this host; 2 = prefill on host 0, decode on host 1
  int prefill_tp = 1, decode_tp = 1;
  int layers = 32, heads = 8, head_dim = 128, page_size = 16;
  int big_tokens = 4096;
  int big_requests = 8, big_concurrency = 2;
  int check_stride = 1;
  // The bandwidth sweep's pattern filled before and checked after its
  // measured window (worker --check-outside-window), every page still.
  bool check_outside_window = false;
  int small_requests = 200;
  int small_step_us = 0;
  // The bandwidth sweep's scheduler step. A real scheduler polls once per
  // forward pass (milliseconds); polling every 100 us cost the TCP sweep
  // about 15% of its GB/s here, the workers' 10,000 wake-ups a second
  // taking the CPU their progress thread shares (docs/benchmarks.md).
  int big_step_us = 1000;
  std::string raw_bytes = "1G";
  std::string raw_region = "256M";
  bool no_raw = false;
  // Rounds of (raw transport, bandwidth sweep), each a fresh pair of
  // processes, one after the other; the report takes the median of each.
  int rounds = 1;
  // Prefill's processes and the raw initiator on one half of the CPUs,
  // decode's and the raw target on the other (cpu_sides.h says why); unset
  // with --no-pin or fewer than two CPUs.
  bool no_pin = false;
  std::optional<CpuSides> pin;
  bool json = false;
  int timeout_s = 120;
  std::string binary = "/proc/self/exe";
};

struct SweepResult {
  std::string name;
  int tokens = 0;
  int requests = 0;
  int warmup = 0;  // unmeasured requests before them (Warmup)
  uint64_t succeeded = 0;
  uint64_t failed = 0;
  uint64_t bytes = 0;
  // Summed over the decode ranks, warm-up requests included.
  uint64_t verified_pages = 0, corrupt_pages = 0;
  double seconds = 0;
  double p50_us = 0, p99_us = 0;
  // The CPUs each side's workers reported they may run on.
  std::set<int> prefill_cpus, decode_cpus;
  std::string error;
  double gbps() const { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
  double rps() const { return seconds > 0 ? succeeded / seconds : 0; }
};

// p50 and p99 of a set of samples.
struct Percentiles {
  double p50 = 0, p99 = 0;
};

// One round: the raw transport's figure, then the bandwidth sweep's.
struct Round {
  double raw = 0;  // GB/s, 0: not measured
  // The same transport writing pieces the size of the requests' writes
  // (Figures::raw_piece_bytes), same run, same processes; 0: not measured.
  double raw_piece = 0;
  SweepResult big;
};

// Everything one run measured, and what follows from it, for the report.
struct Figures {
  std::string where;  // WhereRan: both the sweeps' and the raw reference's
  std::vector<Round> rounds;
  double raw = 0;        // raw transport GB/s (0: not measured), the rounds' median
  double raw_piece = 0;  // the rounds' median at raw_piece_bytes (0: not measured)
  size_t raw_piece_bytes = 0;
  std::string raw_error;
  size_t big_piece = 0;
  double memcpy_before = 0, memcpy_after = 0, memcpy_gbps = 0, memcpy_ratio = 0;
  // memcpy of the same bytes in the runs the engine plans (PlannedRunBytes):
  // differs from the above only when the two sides' tp sizes differ.
  size_t run_bytes = 0;
  double memcpy_runs_gbps = 0, memcpy_runs_ratio = 0;
  SweepResult big, small;
  double ratio = 0;
  bool bw_met = false, lat_met = false, ok = false;
  double page_bytes = 0, floor_us = 0;
  size_t pieces = 0;
  Percentiles one_page_memcpy;
  double memcpy_us = 0, added_p50 = 0, added_p99 = 0;
};

// The workers' poll step in a sweep with `concurrency` requests in flight:
// one is a latency sweep (--latency-step-us), more a bandwidth sweep
// (--step-us).
inline int StepUs(const RequestsFlags& f, int concurrency) {
  return concurrency == 1 ? f.small_step_us : f.big_step_us;
}
// The step the bandwidth sweep's workers ran with.
inline int BandwidthStepUs(const RequestsFlags& f) { return StepUs(f, f.big_concurrency); }

void PrintJson(const RequestsFlags& f, const Figures& m);
void PrintText(const RequestsFlags& f, const Figures& m);

}  // namespace kvbridge::tools::bench_requests
