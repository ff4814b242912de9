// Decode side, for sglang's order: WaitingForInput once the handshake is
// done (before SendMetadata), and waiting for a failed request's writes to
// stop before its pages are freed (PollSettled / WaitQuiesced).
#include <fmt/format.h>

#include <string>

#include "common/log.h"
#include "connector/manager_impl.h"

namespace kvbridge::internal {

void ManagerImpl::MaybeHandshakeDoneLocked(ReceiverRoom& room) {
  if (!room.resolved || room.failure || room.meta || room.poll() != KVPoll::kBootstrapping) return;
  for (const ReceiverSource& src : room.sources) {
    const Peer* peer = FindPeerLocked(src.peer_key);
    if (peer == nullptr || peer->failed || !peer->acked) return;
  }
  // The deadline for SendMetadata runs from here (TickReceiversLocked).
  room.phase = Phase::kWaitingForMetadata;
  room.phase_since = std::chrono::steady_clock::now();
  room.state.store(static_cast<int>(KVPoll::kWaitingForInput), std::memory_order_release);
}

void ManagerImpl::OnPeerAckedLocked(const Peer& peer) {
  for (auto& [id, room] : receivers_) {
    for (const ReceiverSource& src : room->sources) {
      if (src.peer_key != peer.key) continue;
      MaybeHandshakeDoneLocked(*room);
      break;
    }
  }
}

void ManagerImpl::WarnUnsettledLocked(ReceiverRoom& room, SteadyTime now) {
  if (!room.failure || room.unsettled_warned || room.quiesced.load()) return;
  const SteadyTime failed_at(SteadyTime::duration(room.failed_at_ns.load()));
  if (now - failed_at < opts_.quiesce_timeout) return;
  room.unsettled_warned = true;
  std::string waiting;
  for (const ReceiverSource& src : room.sources)
    if (!src.quiesced) waiting += (waiting.empty() ? "" : ", ") + src.prefill.ShortName();
  KVB_LOG_WARN(
      "room {}: failed {:.1f} s ago and {} has not confirmed that no write is in flight; "
      "reporting Failed now, its pages may still be written",
      room.room, std::chrono::duration<double>(now - failed_at).count(), waiting);
}

bool ManagerImpl::WaitReceiverQuiesced(const ReceiverRoom& room,
                                       std::chrono::milliseconds timeout) {
  MutexLock lock(mu_);
  lock.WaitFor(room_records_cv_, timeout,
               [&]() KVB_REQUIRES(mu_) { return room.quiesced.load(std::memory_order_acquire); });
  return room.quiesced.load(std::memory_order_acquire);
}

FailureRecord ManagerImpl::ReceiverFailAsGroup(const std::shared_ptr<ReceiverRoom>& room) {
  FailureRecord r = GroupFailure(*room);
  Outbox out;
  {
    MutexLock lock(mu_);
    if (!room->failure && room->poll() != KVPoll::kSuccess) FailReceiverLocked(*room, r, out);
  }
  Flush(out);
  return r;
}

}  // namespace kvbridge::internal
