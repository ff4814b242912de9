#include "tools/demo_rejoin.h"

#include <algorithm>

namespace kvbridge::tools {

void RejoinStep::Begin(Cluster& c, int victim) {
  started_ = true;
  victim_ = victim;
  began_ = std::chrono::steady_clock::now();
  for (int i = 0; i < c.num_ranks(); ++i) c.WriteLine(i, "hold 0").IgnoreError();
}

void RejoinStep::OnLine(int index, const std::string& line) {
  if (!started_ || !line.starts_with("HELD ")) return;
  auto j = nlohmann::json::parse(line.substr(5), nullptr, false);
  if (j.is_object()) held_[index] = j.value("admitted", int64_t{0});
}

std::string RejoinStep::Poll(Cluster& c, int64_t requests, std::chrono::milliseconds patience) {
  if (!started_ || done_) return "";
  int64_t k = 0;
  for (int i = 0; i < c.num_ranks(); ++i) {
    const ProcessInfo& p = c.process(i);
    if (p.report) {
      k = std::max(k, p.report->value("requests", int64_t{0}));  // its whole stream is done
      continue;
    }
    if (p.stdout_closed) continue;
    auto h = held_.find(i);
    if (h == held_.end()) return "";
    k = std::max(k, h->second);
  }
  const ProcessInfo& v = c.process(victim_);
  const bool rejoined =
      v.report || v.stdout_closed || (v.progress && v.progress->value("rejoins", int64_t{0}) > 0);
  const bool patient = std::chrono::steady_clock::now() - began_ < patience;
  if (!rejoined && patient) return "";
  done_ = true;
  for (int i = 0; i < c.num_ranks(); ++i) {
    c.WriteLine(i, "skip " + std::to_string(k)).IgnoreError();
    c.WriteLine(i, "limit " + std::to_string(requests)).IgnoreError();
  }
  return (rejoined ? v.name + " rejoined under a new incarnation" : v.name + " did not rejoin") +
         "; every rank goes on from request " + std::to_string(k);
}

}  // namespace kvbridge::tools
