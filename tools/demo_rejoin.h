// The demo's step after a fault whose victim lives on (stop-prefill,
// partition-*): before the victim is resumed or its host healed, every
// rank is told to hold where it is; once every rank has held (its rooms of
// the fault failed and drained) and the victim has rejoined under a new
// incarnation, all of them move on to one request (the ranks behind skip
// what the others already failed) and stream on through the same
// processes. Without it the victim, back in the stream, would take up
// requests its partners had long given up, and each side would wait for
// the other's half of different requests.
//
// Thread safety: none; the demo's loop drives it.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

#include "tools/cluster.h"

namespace kvbridge::tools {

class RejoinStep {
 public:
  // Tells every rank to hold; call before the victim can run again.
  void Begin(Cluster& c, int victim);
  // Feeds a line a rank printed (HELD ones count).
  void OnLine(int index, const std::string& line);
  // Once every rank held (or reported) and the victim rejoined (or gave up
  // after `patience`), moves them all on to one request, up to `requests`;
  // returns what it did for the demo's notes, "" while it waits or after.
  std::string Poll(Cluster& c, int64_t requests, std::chrono::milliseconds patience);
  bool started() const { return started_; }

 private:
  bool started_ = false;
  bool done_ = false;
  int victim_ = -1;
  std::chrono::steady_clock::time_point began_{};
  std::map<int, int64_t> held_;  // rank index -> requests it admitted
};

}  // namespace kvbridge::tools
