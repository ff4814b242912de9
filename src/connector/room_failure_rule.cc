#include "connector/room_failure_rule.h"

namespace kvbridge::internal {

std::optional<FailureRecord> RoomFailure(KVPoll poll, bool failed, uint64_t room, Phase phase,
                                         const FailureRecord& record) {
  if (failed || poll == KVPoll::kSuccess || poll == KVPoll::kFailed) return std::nullopt;
  FailureRecord kept = record;
  kept.room = room;
  if (IsRankFailure(kept.cause)) kept.phase = phase;
  return kept;
}

bool PublishesRoomRecord(const FailureRecord& record, bool detected_by_this_process) {
  return !IsRankFailure(record.cause) && detected_by_this_process &&
         record.mechanism != kGroupPollMechanism;
}

}  // namespace kvbridge::internal
