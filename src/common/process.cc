#include "common/process.h"

#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <fstream>
#include <sstream>

namespace kvbridge::internal {

ProcessState GetProcessState(int pid) {
  if (pid <= 0) return ProcessState::kUnknown;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  if (!in) {
    if (kill(pid, 0) != 0 && errno == ESRCH) return ProcessState::kExited;
    return ProcessState::kUnknown;
  }
  std::string line;
  std::getline(in, line);
  // The state follows the parenthesised command name, which may hold spaces.
  size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return ProcessState::kUnknown;
  // A process being killed (PF_EXITING in the flags, five fields after the
  // state) has lost its memory before /proc shows it a zombie: a write into
  // it already fails "No such process", so it counts as exited too.
  std::istringstream rest(line.substr(close + 2));
  std::string state, skip;
  unsigned long flags = 0;
  rest >> state >> skip >> skip >> skip >> skip >> skip >> flags;
  constexpr unsigned long kPfExiting = 0x4;
  if (rest && (flags & kPfExiting) != 0) return ProcessState::kExited;
  switch (line[close + 2]) {
    case 'Z':
    case 'X':
    case 'x':
      return ProcessState::kExited;
    case 'T':
    case 't':
      return ProcessState::kStopped;
    default:
      return ProcessState::kRunning;
  }
}

std::string DescribeProcessState(ProcessState state) {
  switch (state) {
    case ProcessState::kRunning:
      return "running";
    case ProcessState::kStopped:
      return "stopped (SIGSTOP or a debugger)";
    case ProcessState::kExited:
      return "process exited";
    case ProcessState::kUnknown:
      return "state unknown";
  }
  return "state unknown";
}

int RemainingMs(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
}

void NameThisThread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

}  // namespace kvbridge::internal
