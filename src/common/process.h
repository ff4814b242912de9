// What another process on this host is doing, from /proc.
#pragma once

#include <chrono>
#include <string>

namespace kvbridge::internal {

enum class ProcessState {
  kRunning,  // running or sleeping
  kStopped,  // SIGSTOP / traced
  kExited,   // zombie or gone
  kUnknown,  // not on this host, or /proc unreadable
};

ProcessState GetProcessState(int pid);
// "stopped (SIGSTOP or a debugger)", "exited", ...
std::string DescribeProcessState(ProcessState state);

// Milliseconds from now to `deadline` as poll(2) takes them: 0 once it has
// passed, at most 2^30 (so any far deadline still fits an int).
int RemainingMs(std::chrono::steady_clock::time_point deadline);

// Names the calling thread as `top -H`, `ps -L`, perf and gdb show it
// ("kvb-ucx-prog"); the kernel keeps the first 15 characters.
void NameThisThread(const std::string& name);

}  // namespace kvbridge::internal
