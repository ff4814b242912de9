// How one peer's silence is judged at a liveness round (ManagerImpl::Tick):
// whether it gets a heartbeat, whether its unanswered Hello is sent again,
// and whether it is blamed, with which words and by which mechanism. One
// rule, kept apart from the manager so that it is tested alone with scripted
// times and process states: it reads only the Peer, the time it is given and
// what /proc says when asked, and does nothing itself.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "common/clock.h"
#include "common/process.h"
#include "connector/peer_state.h"

namespace kvbridge::internal {

struct LivenessVerdict {
  enum class Kind {
    kQuiet,       // nothing to do (alive, or not this rank's to judge)
    kRetryHello,  // the Hello got no answer: send it again on a new endpoint
    kBlame,       // fail the peer (ManagerImpl::FailSilentPeerLocked)
  };
  Kind kind = Kind::kQuiet;
  // Beat it: every peer that answered our handshake, unless it failed for
  // a reason other than its own reported error (a peer failed that way is
  // alive and must not take our silence for a failure of ours).
  bool beat = false;
  // kBlame: what it failed to do ("silent for 1.23 s", "no answer to 3
  // handshake attempts in ..."), "heartbeat" or "handshake", and what /proc
  // said of it (kUnknown on another host).
  std::string silence;
  const char* mechanism = "";
  ProcessState process = ProcessState::kUnknown;
};

// `silence_limit`: heartbeat interval x misses. `this_rank_failed`: this
// rank reported a fatal error or is fenced, and blames nobody else.
// `process_state` is asked at most once, only when a silence is long
// enough to blame (it reads /proc).
LivenessVerdict JudgeLiveness(const Peer& peer, SteadyTime now,
                              std::chrono::microseconds silence_limit, bool this_rank_failed,
                              const std::function<ProcessState()>& process_state);

}  // namespace kvbridge::internal
