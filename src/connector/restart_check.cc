// A new request that a dead rank's failure record would block. The record
// may be outdated: that rank may have restarted at its position, and then
// the request must go through. Only the registry can tell, and asking it
// is a network wait, so KVSender/KVReceiver::Create do not ask: the room
// is numbered for a check, and the registry thread's next round (woken at
// once) reads who is alive and fails each such room a record still blocks.
// Meanwhile the room goes on as any new request does (it may adopt
// metadata, even transfer): only the dead rank's record is not held
// against it until the check; the check can then fail it at any stage, and
// its writes are fenced as any failed room's are. Success waits for the
// check (it is final): a sender holds its last notices, a receiver whose
// every write landed stays Transferring.
#include "common/log.h"
#include "connector/manager_impl.h"

namespace kvbridge::internal {

template <typename Room>
bool ManagerImpl::BlockNewRoomLocked(Room& room, const FailureRecord& blocker, Outbox& out) {
  // A fenced rank or a lost registry blocks whatever the registry says; a
  // registry that keeps no liveness (sglang's) cannot show a restart.
  const bool may_lift = !fatal_ && !registry_lost_ && !sglang_registry_ && !hooks_.manual_ticks;
  if (!may_lift) {
    if constexpr (std::is_same_v<Room, SenderRoom>) {
      FailSenderLocked(room, blocker, out);
    } else {
      FailReceiverLocked(room, blocker, out);
    }
    return false;
  }
  room.restart_check = ++restart_checks_;
  return true;
}
template bool ManagerImpl::BlockNewRoomLocked(SenderRoom&, const FailureRecord&, Outbox&);
template bool ManagerImpl::BlockNewRoomLocked(ReceiverRoom&, const FailureRecord&, Outbox&);

void ManagerImpl::SettleRestartChecks(uint64_t upto, const std::vector<RankStatus>* ranks) {
  Outbox out;
  {
    MutexLock lock(mu_);
    if (ranks != nullptr) ForgetRestartedLocked(*ranks);
    auto settle = [&](auto& rooms, auto fail) KVB_REQUIRES(mu_) {
      for (auto& [id, room] : rooms) {
        if (room->restart_check == 0 || room->restart_check > upto) continue;
        room->restart_check = 0;
        const FailureRecord* dead = nullptr;
        if constexpr (std::is_same_v<std::decay_t<decltype(*room)>, SenderRoom>)
          dead = DeadFlowRankLocked(*room);
        if (auto blocker = NewRoomBlockerLocked()) {
          fail(*room, *blocker);
        } else if (dead != nullptr) {
          fail(*room, *dead);
        } else if constexpr (std::is_same_v<std::decay_t<decltype(*room)>, SenderRoom>) {
          // Passed: what waited for the check (last notices, Success) goes.
          for (auto& [tp, flow] : room->flows) SendFinalNoteLocked(*room, flow, out);
          UpdateSenderStateLocked(*room);
        } else if (room->phase == Phase::kDone && !room->failure) {
          SucceedReceiverLocked(*room);  // every write had landed (OnNotify)
        }
      }
    };
    settle(senders_, [&](SenderRoom& r, const FailureRecord& f)
                         KVB_REQUIRES(mu_) { FailSenderLocked(r, f, out); });
    settle(receivers_, [&](ReceiverRoom& r, const FailureRecord& f)
                           KVB_REQUIRES(mu_) { FailReceiverLocked(r, f, out); });
  }
  Flush(out);
}

// Prefill: metadata adopted while the check was pending skipped
// RefuseMetaLocked's dead-rank rule; it is applied here.
const FailureRecord* ManagerImpl::DeadFlowRankLocked(const SenderRoom& room) const {
  for (const auto& [tp, flow] : room.flows)
    if (const FailureRecord* dead = DeadRankOfInstanceLocked(flow.decode)) return dead;
  return nullptr;
}

void ManagerImpl::ForgetRestartedRanks() {
  {
    MutexLock lock(mu_);
    if (fatal_ || registry_lost_ || !NewRoomBlockerLocked()) return;
  }
  Result<std::vector<RankStatus>> ranks = registry_->ListRanks();
  if (!ranks.ok()) return;
  MutexLock lock(mu_);
  ForgetRestartedLocked(*ranks);
}

void ManagerImpl::ForgetRestartedLocked(const std::vector<RankStatus>& ranks) {
  for (const RankStatus& s : ranks) {
    const RankId id = RankIdOf(s.record);
    auto dead = dead_ranks_.find(PeerKey(id));
    if (dead == dead_ranks_.end() || dead->second.origin.incarnation == s.record.incarnation ||
        s.state != Liveness::kAlive)
      continue;
    KVB_LOG_INFO("{} restarted (pid {})", id.ShortName(), s.record.pid);
    dead_ranks_.erase(dead);
  }
}

}  // namespace kvbridge::internal
