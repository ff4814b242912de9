#include "connector/rank_failure_rule.h"

namespace kvbridge::internal {

RankFailureAction JudgeRankFailure(const FailureRecord& r, const RankFailureFacts& f) {
  if (r.origin.role == Role::kBootstrap || !IsRankFailure(r.cause))
    return RankFailureAction::kIgnore;
  if (f.about_self) {
    // News of an earlier life of this rank, or of a failure it reported.
    if (!f.current_incarnation || f.this_rank_failed) return RankFailureAction::kIgnore;
    return f.failed_it_first && f.failed_it_first() ? RankFailureAction::kIgnore
                                                    : RankFailureAction::kFenceSelf;
  }
  if (f.applied) return RankFailureAction::kIgnore;
  return f.replaced && f.replaced() ? RankFailureAction::kDropStale : RankFailureAction::kApply;
}

bool KeptAcrossRejoin(const FailureRecord& held, const RankId& self, bool published) {
  const bool own_finding = held.detected_by.SameRank(self) && held.detected_by.pid == self.pid;
  return published || !own_finding;
}

std::optional<std::pair<std::string, uint64_t>> RankFailureOfAnother(
    const FailureRecord& r, const RankId& self, std::string (*key)(const RankId&)) {
  if (!IsRankFailure(r.cause) || r.origin.SameRank(self)) return std::nullopt;
  return std::make_pair(key(r.origin), r.origin.incarnation);
}

bool RankFailureTouches(const RankId& origin, bool sibling, const SenderRoom& room) {
  if (sibling) return true;
  if (origin.role != Role::kDecode) return false;
  for (const auto& [rank, flow] : room.flows)
    if (flow.decode.dp == origin.dp && flow.decode.instance == origin.instance) return true;
  return false;
}

bool OfRoomDecodeGroup(const SenderRoom& room, const RankId& from) {
  if (room.flows.empty()) return true;
  const RankId& group = room.flows.begin()->second.decode;
  return from.dp == group.dp && from.instance == group.instance;
}

bool RankFailureTouches(const RankId& origin, bool sibling, const ReceiverRoom& room) {
  if (sibling) return true;
  return origin.role == Role::kPrefill && room.initialized && room.prefill_dp_rank == origin.dp;
}

}  // namespace kvbridge::internal
