// `kvbridge bench progress-step`: what naming the progress thread's step
// (StepWatch, read by the manager to say where a stuck transport thread
// waits) costs each pass of the UCX progress loop, next to that pass
// without it, measured in the same run.
#pragma once

#include <cstdint>

namespace kvbridge::bench {

struct ProgressStepOptions {
  uint64_t calls = 2'000'000;  // progress calls per round and variant
  int rounds = 5;              // alternating rounds; the best of each kept
  bool json = false;
};

int RunProgressStepBench(const ProgressStepOptions& options);

}  // namespace kvbridge::bench
