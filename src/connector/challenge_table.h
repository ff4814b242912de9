// What a prefill rank remembers of handshakes in progress (issue 9's Hello
// flood; docs/protocol.md, "The handshake"). No Hello is kept: a challenge
// is derived from the Hello (ChallengeMaker, peer_auth.h) and the proof
// brings the Hello back. What is kept is bounded and harmless to lose: the
// endpoints the newest challenges went out on (a proof whose endpoint was
// let go connects anew), and the sessions proven while a challenge is good
// (only a proof that checked adds one; a proof replayed is refused).
//
// Sans-I/O: no socket, thread or clock; the caller passes the time and
// closes the endpoints this hands back. Thread safety: none (ManagerImpl
// holds it under its mutex).
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <map>
#include <optional>
#include <vector>

#include "connector/peer_auth.h"
#include "kvbridge/errors.h"
#include "transport/transport.h"

namespace kvbridge::internal {

class ChallengeTable {
 public:
  static constexpr size_t kMaxEndpoints = 64;
  // An endpoint let go is closed this long after (at a Due call), not at
  // once: its challenge, queued on it, leaves first. Closing drops what is
  // queued, so a flood of Hellos handled before the genuine challenge left
  // would have dropped it. Past kMaxClosing, the oldest close at once.
  static constexpr std::chrono::seconds kCloseDelay{1};
  static constexpr size_t kMaxClosing = 1024;
  // A challenge (ChallengeMaker) is good in its window and the next:
  // nothing here outlives that.
  static constexpr auto kLifetime = 2 * ChallengeMaker::kWindow;

  struct Kept {
    std::vector<PeerId> close_now;        // let go past kMaxClosing
    std::optional<double> again_after_s;  // since an unproven Hello of the same process
  };
  // Keeps `tpeer`, back to `from`, for the proof of challenge `session`.
  Kept Keep(uint64_t session, const RankId& from, PeerId tpeer, SteadyTime now);
  // For a proof that checked: false when `session` was proven already.
  bool FirstProof(uint64_t session, SteadyTime now);
  // The endpoint kept for `session` when `from` sent its Hello (taken off
  // the table); nullopt otherwise.
  std::optional<PeerId> TakeEndpoint(uint64_t session, const RankId& from);
  // The transport failed `tpeer`: taken off the table when kept; the
  // process it was kept for.
  std::optional<RankId> Forget(PeerId tpeer);
  // The endpoints let go kCloseDelay or more before `now`, to close; those
  // kept past kLifetime are let go (a tick calls it: none stays open when
  // no Hello comes).
  std::vector<PeerId> Due(SteadyTime now);
  // Every endpoint kept or let go, taken off the table (a rejoin: the old
  // sessions).
  std::vector<PeerId> Clear();

 private:
  struct Endpoint {
    RankId from;
    PeerId tpeer = 0;
    SteadyTime at;
  };
  std::map<uint64_t, Endpoint> endpoints_;             // by session id
  std::map<uint64_t, SteadyTime> proven_;              // session id -> when
  std::deque<std::pair<PeerId, SteadyTime>> closing_;  // let go, oldest first
  void LetGo(PeerId tpeer, SteadyTime now, Kept& out);
  void LetGoExpired(SteadyTime now, Kept& out);  // kept past kLifetime
};

}  // namespace kvbridge::internal
