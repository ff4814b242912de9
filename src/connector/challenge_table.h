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

#include <cstddef>
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
  // A challenge (ChallengeMaker) is good in its window and the next:
  // nothing here outlives that.
  static constexpr auto kLifetime = 2 * ChallengeMaker::kWindow;

  struct Kept {
    std::vector<PeerId> let_go;           // to close: expired, replaced, or the oldest
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
  // Every endpoint kept, taken off the table (a rejoin: the old sessions).
  std::vector<PeerId> Clear();

 private:
  struct Endpoint {
    RankId from;
    PeerId tpeer = 0;
    SteadyTime at;
  };
  std::map<uint64_t, Endpoint> endpoints_;  // by session id
  std::map<uint64_t, SteadyTime> proven_;   // session id -> when
};

}  // namespace kvbridge::internal
