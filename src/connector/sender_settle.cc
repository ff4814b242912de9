// Prefill side, once a request is over: its last notice, and its answer to
// decode's notice of a failed room, "quiesced", given only once none of its
// writes is left to land, even after the application released its sender.
#include <algorithm>

#include "connector/manager_impl.h"
#include "connector/rank_failure_rule.h"

namespace kvbridge::internal {

void ManagerImpl::SendFinalNoteLocked(SenderRoom& room, SenderFlow& flow, Outbox& out) {
  // A room awaiting its restart check sends it once the check passed it
  // (SettleRestartChecks): decode would take Success from it.
  if (flow.inflight > 0 || !flow.final_note || room.failure || room.restart_check != 0) return;
  Peer* peer = FindPeerLocked(flow.peer_key);
  // Its writes completed: it waits for none posted since (other requests').
  if (peer != nullptr && !peer->failed) Send(out, *peer, *flow.final_note, Lane::kUnfenced);
  flow.final_note.reset();
  flow.closed = true;  // decode has all it needs; a later failure here is not its concern
}

void ManagerImpl::DrainFlowLocked(SenderRoom& room, SenderFlow& flow, Outbox& out) {
  if (flow.inflight > 0 || !flow.quiesce_reply) return;
  flow.quiesce_reply = false;
  flow.closed = true;
  Peer* peer = FindPeerLocked(flow.peer_key);
  if (peer != nullptr && !peer->failed)
    Send(out, *peer, QuiescedMsg{room.room, flow.meta.generation});
}

void ManagerImpl::OnDecodeRoomFailed(const RankId& from, const RoomFailedMsg& msg, Outbox& out) {
  Peer* peer = PeerFromLocked(from);
  if (peer == nullptr) return;
  SenderRoom* owner = nullptr;
  SenderFlow* flow = FlowOfLocked(msg.room, from.tp, msg.generation, &owner);
  if (flow != nullptr && !OfRoomDecodeGroup(*owner, from)) flow = nullptr;  // another group's
  if (flow == nullptr) {
    auto it = senders_.find(msg.room);
    // A live request of another decode group (instance, dp) holds the room
    // id here: the notice is about that group's use of it, not this one.
    const bool other_group =
        it != senders_.end() && it->second->live && !OfRoomDecodeGroup(*it->second, from);
    // About a request a released sender served (nothing of it is in
    // flight: FlowOfLocked found none): the room's next use is not its
    // concern. Otherwise the inbox keeps it for the sender or metadata to
    // come.
    const bool closed = other_group || inbox_.OnNoticeWithoutFlow(msg.room, from.tp, msg.generation,
                                                                  msg.record, Now());
    // A live sender that has no metadata from that rank yet is this
    // request's: decode failed it before (or without) sending metadata, so
    // none will come. It fails now with decode's reason instead of waiting
    // for its deadline.
    if (!closed && it != senders_.end() && it->second->live && !it->second->flows.count(from.tp)) {
      SenderRoom& room = *it->second;
      room.aborted_generations[from.tp] = msg.generation;
      FailSenderLocked(room, msg.record, out);
    }
    if (sglang_registry_) RelayRoomFailureLocked(from, msg, out);
    if (!msg.quiesced) Send(out, *peer, QuiescedMsg{msg.room, msg.generation});
    return;
  }
  SenderRoom& room = *owner;
  flow->told = true;
  flow->quiesce_reply = true;
  FailSenderLocked(room, msg.record, out);
  DrainFlowLocked(room, *flow, out);
}

SenderFlow* ManagerImpl::FlowOfLocked(uint64_t room, int decode_tp, uint64_t generation,
                                      SenderRoom** owner) {
  auto in = [&](SenderRoom& r) -> SenderFlow* {
    auto f = r.flows.find(decode_tp);
    if (f == r.flows.end() || f->second.meta.generation != generation) return nullptr;
    *owner = &r;
    return &f->second;
  };
  if (auto it = senders_.find(room); it != senders_.end())
    if (SenderFlow* f = in(*it->second)) return f;
  auto [first, last] = released_writing_.equal_range(room);
  for (auto it = first; it != last; ++it)
    if (SenderFlow* f = in(*it->second)) return f;
  return nullptr;
}

void ManagerImpl::KeepReleasedWritingLocked(const std::shared_ptr<SenderRoom>& room) {
  if (room->live) return;
  auto [first, last] = released_writing_.equal_range(room->room);
  auto it = std::find_if(first, last, [&](const auto& e) { return e.second == room; });
  if (room->inflight > 0 && it == last) released_writing_.emplace(room->room, room);
  if (room->inflight == 0 && it != last) released_writing_.erase(it);
}

}  // namespace kvbridge::internal
