// Phase deadlines: whether a request has sat too long in its phase at a
// liveness round, and what its failure says (whom it names, the phase, the
// words). One rule per side, kept apart from the manager so that it is
// tested alone with scripted times: it reads the room, the round's time,
// the timeouts and (prefill) which decode ranks this rank met, and does
// nothing itself. ManagerImpl::TickSendersLocked / TickReceiversLocked turn
// a breach into a failure record and fail the room.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "connector/rooms.h"
#include "kvbridge/errors.h"

namespace kvbridge::internal {

struct PhaseTimeouts {
  std::chrono::milliseconds bootstrap{30000};
  std::chrono::milliseconds waiting{30000};   // for metadata, input, chunks
  std::chrono::milliseconds transfer{10000};  // a posted chunk
};

struct DeadlineBreach {
  // The rank the failure names; none: this rank.
  std::optional<RankId> origin;
  std::string detail;
  Phase phase = Phase::kBootstrapping;
  const char* mechanism = "phase deadline";  // or "transfer deadline"
  uint64_t generation = 0;  // a transfer deadline: the decode generation it was for
};

// Prefill: a room that has not failed or succeeded. Its posted writes past
// `transfer` name the first decode rank with writes in flight; otherwise,
// past `waiting`: still bootstrapping, the decode ranks whose metadata never
// came (naming the first one SilentDecodeRank finds among the decode ranks
// this rank met, `met_decode`, else itself); waiting for input, the
// application that sent no chunk.
std::optional<DeadlineBreach> SenderDeadline(const SenderRoom& room, SteadyTime now,
                                             const PhaseTimeouts& timeouts,
                                             const std::vector<RankId>& met_decode);

// The decode rank at tp `decode_tp` whose metadata `room` still waits for,
// among the ranks this rank met: of the same instance, dp and stage as the
// decode ranks whose metadata came (with several decode dp ranks or
// instances, a rank at that tp may be another group's). None when none
// came or that rank was never met.
std::optional<RankId> SilentDecodeRank(const SenderRoom& room, int decode_tp,
                                       const std::vector<RankId>& met_decode);

// Decode: a source's handshake that has not completed, as the room's
// deadline tells it: the refusals (kRefusedAsDeclaredFailed) its prefill
// rank sent that were taken, and the last one's words.
struct PendingHandshake {
  int refusals = 0;
  std::string refusal;
};

// Decode: an initialized room that has not failed or succeeded, with its
// sources resolved (its time counted from then while it bootstraps). Past
// `waiting`: while a source's handshake is pending (`pending(source)`;
// sglang's decode sends metadata only once the room says WaitingForInput,
// and metadata given earlier waits for the handshake too), that handshake:
// refused by any source, this process itself (a record declared it failed
// and no registry told it); otherwise unanswered, the first such prefill
// rank. With every handshake done: without metadata, the application that
// did not call SendMetadata; with it, the first source (not a dummy) whose
// last chunk never came.
std::optional<DeadlineBreach> ReceiverDeadline(
    const ReceiverRoom& room, SteadyTime now, const PhaseTimeouts& timeouts,
    const std::function<std::optional<PendingHandshake>(const ReceiverSource&)>& pending);

}  // namespace kvbridge::internal
