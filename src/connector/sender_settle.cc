// Prefill side, once a request is over: its last notice, and its answer to
// decode's notice of a failed room, "quiesced", given only once none of its
// writes is left to land, even after the application released its sender.
#include <algorithm>

#include "connector/manager_impl.h"

namespace kvbridge::internal {

void ManagerImpl::SendFinalNoteLocked(SenderRoom& room, SenderFlow& flow, Outbox& out) {
  if (flow.inflight > 0 || !flow.final_note || room.failure) return;
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
  if (flow == nullptr && closed_flows_.Holds(msg.room, from.tp, msg.generation)) {
    // About a request a released sender served: nothing of it is in flight
    // (FlowOfLocked found none), and the room's next use is not its concern.
    if (sglang_registry_) RelayRoomFailureLocked(from, msg, out);
    if (!msg.quiesced) Send(out, *peer, QuiescedMsg{msg.room, msg.generation});
    return;
  }
  if (flow == nullptr) {
    auto it = senders_.find(msg.room);
    auto pm = pending_meta_.find({msg.room, from.tp});
    if (pm != pending_meta_.end() && pm->second.meta.generation == msg.generation)
      pending_meta_.erase(pm);
    // Remembered even with a live sender: the notice may have overtaken its
    // request's metadata (sent by another decode thread just before), which
    // must then not be adopted.
    // Bounded as pending metadata: past the limit a notice is not kept (the
    // sender, if it comes, then waits for its deadline as before notices).
    if (pending_abort_.size() < opts_.max_pending_requests ||
        pending_abort_.count({msg.room, from.tp}))
      pending_abort_[{msg.room, from.tp}] = PendingAbort{msg.record, msg.generation, Now()};
    // A live sender that has no metadata from that rank yet is this
    // request's: decode failed it before (or without) sending metadata, so
    // none will come. It fails now with decode's reason instead of waiting
    // for its deadline.
    if (it != senders_.end() && it->second->live && !it->second->flows.count(from.tp)) {
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
