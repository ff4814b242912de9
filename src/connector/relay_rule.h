// Whether a decode rank takes a room record that a prefill rank relayed
// (RoomFailed with generation 0; ManagerImpl::RelayRoomFailureLocked,
// docs/protocol.md). Such a record fails a room here without naming this
// rank's generation of it, so it is taken only when it can be this room's:
// one rule, kept apart from the manager so that it is tested alone.
#pragma once

#include <optional>
#include <string>

#include "common/clock.h"
#include "connector/protocol.h"
#include "connector/rooms.h"

namespace kvbridge::internal {

// A record about one request (a room), not about a rank or the registry.
bool IsRoomRecord(const FailureRecord& r);

// Why `msg`'s record cannot be the record of the room it is sent for (not a
// room's, or another room's), or nullopt: the part of the rule both ends of
// a relay apply (RelayRoomFailureLocked before passing a record on).
std::optional<std::string> RoomRecordRefusal(const RoomFailedMsg& msg);

// Why `msg` from `from` is refused, or nullopt when it is taken. Taken: from
// a prefill rank; a room record (not a rank's failure) about the room it is
// sent for; and, when this rank holds that room with its sources known
// (`room` non-null), from the prefill instance and dp rank the room reads
// from. A room this rank does not hold (yet) keeps the record for its
// group poll only.
std::optional<std::string> RelayedRecordRefusal(const RankId& from, const RoomFailedMsg& msg,
                                                const ReceiverRoom* room);

// A record as this rank takes it from peer `from` (any message that
// carries one). Its fields are the sender's word: one that says this
// process detected it is not this process's finding (an echo or a forgery:
// it would be published to the registry as this rank's own) and is kept as
// `from`'s; its detection time is DatedNoLaterThan `now`.
FailureRecord AsTakenFromPeer(FailureRecord r, const RankId& from, const RankId& self,
                              WallTime now);

// `r` with a detection time after `now` taken as `now`: a record from the
// future would match every later use of its room id (SameRequest). For
// every record another rank dates: told by a peer (AsTakenFromPeer) or
// read from the registry, where a registered rank may date its own records
// as it likes.
FailureRecord DatedNoLaterThan(FailureRecord r, WallTime now);

}  // namespace kvbridge::internal
