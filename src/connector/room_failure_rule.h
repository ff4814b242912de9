// How a request fails on this rank: whether its room takes a failure now and
// the record it keeps, and whether that record travels to the request's
// other ranks (ManagerImpl::MarkRoomFailedLocked applies it). One rule,
// kept apart from the manager so that it is tested alone.
#pragma once

#include <optional>

#include "kvbridge/errors.h"
#include "kvbridge/kv_poll.h"

namespace kvbridge::internal {

// Success and Failed are final: a room that ended takes nothing (the first
// record stays). Otherwise the record as the room keeps it: naming the room,
// and, for a rank's failure, in the phase the request was in here (the
// detector's record says what the detector was doing).
std::optional<FailureRecord> RoomFailure(KVPoll poll, bool failed, uint64_t room, Phase phase,
                                         const FailureRecord& record);

// The mechanism of the record a rank makes up when its group failed a
// request and no record of why reached it (ManagerImpl::GroupFailure).
inline constexpr char kGroupPollMechanism[] = "group poll";

// Whether this rank publishes the room's record for the request's other
// ranks: a request's own failure (bad input, abort, layout, deadline)
// detected by this very process. A rank's failure is published once, by
// whoever detected it. A record made up by the group poll is not a finding:
// published, it would reach the other ranks as this rank's own abort and
// could stand first in place of the real record still on its way.
bool PublishesRoomRecord(const FailureRecord& record, bool detected_by_this_process);

}  // namespace kvbridge::internal
