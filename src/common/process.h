// What another process on this host is doing, from /proc.
#pragma once

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

}  // namespace kvbridge::internal
