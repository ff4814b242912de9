#include "connector/relay_rule.h"

#include <fmt/format.h>

#include <utility>

namespace kvbridge::internal {

bool IsRoomRecord(const FailureRecord& r) {
  return r.room != 0 && !IsRankFailure(r.cause) && r.cause != FailureCause::kRegistryLost;
}

std::optional<std::string> RoomRecordRefusal(const RoomFailedMsg& msg) {
  if (!IsRoomRecord(msg.record))
    return fmt::format("the record (room {}, cause {}) is not a room's", msg.record.room,
                       FailureCauseName(msg.record.cause));
  if (msg.record.room != msg.room)
    return fmt::format("the record names room {}, not room {}", msg.record.room, msg.room);
  return std::nullopt;
}

std::optional<std::string> RelayedRecordRefusal(const RankId& from, const RoomFailedMsg& msg,
                                                const ReceiverRoom* room) {
  if (from.role != Role::kPrefill) return fmt::format("{} is not a prefill rank", from.ShortName());
  if (auto why = RoomRecordRefusal(msg)) return why;
  if (room == nullptr || room->sources.empty()) return std::nullopt;
  const RankId& source = room->sources.front().prefill;
  if (from.instance != source.instance || from.dp != room->prefill_dp_rank)
    return fmt::format("room {} reads from prefill instance '{}' dp{}, not from {}", msg.room,
                       source.instance, room->prefill_dp_rank, from.ShortName());
  return std::nullopt;
}

FailureRecord AsTakenFromPeer(FailureRecord r, const RankId& from, const RankId& self,
                              WallTime now) {
  // This process, whatever incarnation (the publish rule's test).
  if (r.detected_by.SameRank(self) && r.detected_by.pid == self.pid) r.detected_by = from;
  return DatedNoLaterThan(std::move(r), now);
}

FailureRecord DatedNoLaterThan(FailureRecord r, WallTime now) {
  if (r.detected_at > now) r.detected_at = now;
  return r;
}

}  // namespace kvbridge::internal
