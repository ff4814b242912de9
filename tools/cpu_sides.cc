#include "tools/cpu_sides.h"

#include <sched.h>

#include <algorithm>

namespace kvbridge::tools {

namespace {

std::string Join(std::vector<int>::const_iterator begin, std::vector<int>::const_iterator end) {
  std::string out;
  for (auto it = begin; it != end; ++it) out += (out.empty() ? "" : ",") + std::to_string(*it);
  return out;
}

}  // namespace

std::optional<CpuSides> SplitCpus(std::vector<int> cpus) {
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  if (cpus.size() < 2 || cpus.front() < 0) return std::nullopt;
  const auto half = cpus.begin() + static_cast<std::ptrdiff_t>(cpus.size() / 2);
  return CpuSides{Join(cpus.begin(), half), Join(half, cpus.end())};
}

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return {};
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

std::vector<std::string> PinCommand(const std::string& cpus) {
  return {"/usr/bin/taskset", "--cpu-list", cpus};
}

}  // namespace kvbridge::tools
