// What a proven Hello does to the peer a prefill rank already holds at the
// Hello's position (ManagerImpl::KeepOldPeerLocked, handshake.cc): the one
// rule between a rank's generations as its peers see them. The same process
// may say Hello again (our answer was lost, or its endpoint is stuck); a
// restarted or rejoined one comes under a new incarnation; a failed one may
// come back only to be told, or to tell. Kept apart from the manager so that
// it is tested alone; the manager gathers the facts and carries out the fate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/digest.h"
#include "kvbridge/errors.h"

namespace kvbridge::internal {

// What prefill knows about the peer it holds at the Hello's position.
struct OldPeerFacts {
  bool exists = false;            // a peer is held there at all
  bool same_incarnation = false;  // the Hello's incarnation is the held peer's
  bool ready = false;             // its handshake completed
  bool retired = false;           // this rank retired it when it rejoined
  bool failed = false;
  // With sglang's server (no registry records): the held peer's failure is
  // one the two ranks must tell each other (IsFailureNotice), and the peer's
  // session closed when it failed.
  bool failure_notice = false;
  bool flows_use_it = false;  // a request writes to it over our endpoint
  // A record applied here declared the Hello's very process (its position
  // and incarnation) failed: it lives on (it was stopped or cut off) and
  // has not yet heard so.
  bool declared_dead = false;
};

enum class OldPeerFate {
  kNone,               // nothing held: the Hello makes a new peer
  kStaysFailed,        // the same process, failed: it stays failed, the new endpoint is closed
  kTakesNewSession,    // the same failed process, to be told or to tell: the new
                       // endpoint becomes its session and is answered; it stays failed
  kAnsweredAgain,      // the same process, requests flow to it: answered again on
                       // our endpoint, the new one is closed
  kReplaced,           // the same process, nothing flows (our endpoint may be the
                       // stuck one): dropped, and the Hello makes a new peer
  kReplacedRestarted,  // another process at the position (or one this rank
                       // retired): failed unless it already was, dropped, and
                       // the Hello makes a new peer
  kToldItFailed,       // the Hello's process was declared failed: it makes no
                       // peer and replaces none; it is refused, naming the
                       // record, and its endpoint is closed (its registry
                       // fences it; it rejoins as a new incarnation)
};

// A proven Hello never makes a peer of a process declared failed here:
// every other rank holds its requests failed, so serving it would let its
// new requests straddle the record.
OldPeerFate FateOfOldPeer(const OldPeerFacts& f);

// Whether the Hello makes no new peer (the held one, if any, stays).
bool KeepsOldPeer(OldPeerFate fate);

// Decode: whether a refusal of its Hello as declared failed
// (kRefusedAsDeclaredFailed) is taken (its endpoint let go, a registry
// round woken). One per Hello attempt (`hello_attempts`, the attempt whose
// refusal was last taken: `refused_attempt`), none once a session was
// answered (`acked`): a prefill process, hostile or confused, cannot use
// the code to drop an endpoint in use or to drive registry rounds.
bool TakesRefusal(bool acked, int refused_attempt, int hello_attempts);

// Decode: a Hello sent and not answered yet.
struct SentHello {
  uint64_t session = 0;  // the challenge names it
  Digest digest{};       // of `bytes`: the transcript's
  std::string bytes;     // as sent: the proof carries them back
  std::string address;   // where it asked prefill to connect back
};
inline constexpr size_t kHellosKept = 4;

// Keeps `sent` among the Hellos a challenge may answer (`kept`, oldest
// first, at most kHellosKept). Any of them: a prefill rank slower than
// decode's retries (a loaded host) answers an earlier attempt, and that
// answer proves it as well as one to the last would. Only the last is
// kept when its address differs from the others': a retry moved off a
// path that got no answer (transport.h, ConnectOverNetwork), and a
// challenge that came over the old one is late.
void KeepHello(std::vector<SentHello>& kept, SentHello sent);

// The kept Hello whose session a challenge names; nullptr when none (a
// Hello dropped, answered or never sent: the challenge is late or forged).
SentHello* HelloAnswered(std::vector<SentHello>& kept, uint64_t session);

// What the held peer's record says (cause peer_exited) when a new
// incarnation takes its position and the peer was not failed yet, on either
// side: the same process (host and boot, pid) rejoined, or another process
// took its place.
std::string NewIncarnationDetail(const RankId& old, const RankId& now);

}  // namespace kvbridge::internal
