// Decode side, for sglang's order: WaitingForInput once the handshake is
// done (before SendMetadata), and waiting for a failed request's writes to
// stop before its pages are freed (PollSettled / WaitQuiesced).
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/log.h"
#include "connector/manager_impl.h"

namespace kvbridge::internal {

void ManagerImpl::MaybeHandshakeDoneLocked(ReceiverRoom& room) {
  if (!room.resolved || room.failure || room.meta_given || room.poll() != KVPoll::kBootstrapping)
    return;
  for (const ReceiverSource& src : room.sources) {
    const Peer* peer = FindPeerLocked(src.peer_key);
    if (peer == nullptr || peer->failed || !peer->acked) return;
  }
  // The deadline for SendMetadata runs from here (TickReceiversLocked).
  room.phase = Phase::kWaitingForMetadata;
  room.phase_since = Now();
  changes_.Set(room, KVPoll::kWaitingForInput);
}

void ManagerImpl::OnPeerAckedLocked(Peer& peer, Outbox& out) {
  for (auto& [id, room] : receivers_) {
    bool of_peer = false;
    for (const ReceiverSource& src : room->sources) {
      if (src.peer_key != peer.key) continue;
      of_peer = true;
      // The same process met again under the incarnation a failed room's
      // pages went to, in an earlier session (this rank rejoined and retired
      // it): asked again to say when none of its writes of the room is left,
      // as the notice on that session went with it (OnDecodeRoomFailed
      // answers once they finished, or at once).
      if (room->failure && !src.quiesced && src.session != 0 && src.session != peer.session &&
          src.prefill->incarnation == peer.id->incarnation)
        Send(out, peer, RoomFailedMsg{room->room, room->generation, false, *room->failure});
    }
    if (of_peer) MaybeHandshakeDoneLocked(*room);
  }
}

void ManagerImpl::WarnUnsettledLocked(ReceiverRoom& room, SteadyTime now) {
  if (!room.failure || room.unsettled_warned || room.quiesced.load()) return;
  const SteadyTime failed_at(SteadyTime::duration(room.failed_at_ns.load()));
  if (now - failed_at < opts_.quiesce_timeout) return;
  room.unsettled_warned = true;
  std::string waiting;
  for (const ReceiverSource& src : room.sources)
    if (!src.quiesced) waiting += (waiting.empty() ? "" : ", ") + src.prefill->ShortName();
  KVB_LOG_WARN(
      "room {}: failed {:.1f} s ago and {} has not confirmed that no write is in flight; "
      "reporting Failed now, its pages may still be written",
      room.room, std::chrono::duration<double>(now - failed_at).count(), waiting);
}

// Tells the prefill rank of `src` that the room failed, unless it knows.
// Prefill learns why even when no metadata went out: its sender would
// otherwise wait for metadata until its deadline and blame itself.
void ManagerImpl::TellSourceLocked(ReceiverRoom& room, ReceiverSource& src,
                                   const FailureRecord& record, Outbox& out) {
  Peer* peer = FindPeerLocked(src.peer_key);
  const bool quiet = SettleSourceLocked(room, src, peer);
  if (peer == nullptr) return;
  if (peer->failed) {
    // One that may still write is asked to say when it stopped.
    if (!quiet && !src.told && src.meta_sent) {
      Send(out, *peer, RoomFailedMsg{room.room, room.generation, false, record}, Lane::kUrgent);
    }
    src.told = true;
    return;
  }
  if (src.told) return;
  src.told = true;
  Send(out, *peer, RoomFailedMsg{room.room, room.generation, !src.meta_sent, record});
}

void ManagerImpl::FailReceiverLocked(ReceiverRoom& room, FailureRecord record, Outbox& out) {
  record.generation = room.generation;
  if (!room.failure && room.poll() != KVPoll::kSuccess) {
    room.state_before_failure.store(static_cast<int>(room.poll()), std::memory_order_relaxed);
    room.failed_at_ns.store(Now().time_since_epoch().count(), std::memory_order_relaxed);
  }
  if (!MarkRoomFailedLocked(room, record)) return;
  for (ReceiverSource& src : room.sources) TellSourceLocked(room, src, record, out);
  if (sglang_registry_) TellWitnessesLocked(room, record, out);
  if (room.initialized && !room.resolved)
    AddFailedSourcesLocked(room, KnownSourcesLocked(room), out);
  UpdateQuiescedLocked(room);
}

// The room's request fails on every rank of both groups (sglang polls them
// as one): a prefill rank that sends nothing to this rank learns why from
// here, with no registry to read it from. Quiesced: it writes nothing here.
void ManagerImpl::TellWitnessesLocked(const ReceiverRoom& room, const FailureRecord& record,
                                      Outbox& out) {
  if (!room.resolved) return;
  for (auto& [key, peer] : peers_) {
    const RankId& id = peer->id;
    if (peer->failed || !peer->ready || id.role != Role::kPrefill || id.dp != room.prefill_dp_rank)
      continue;
    bool source = false;
    for (const ReceiverSource& s : room.sources) source = source || s.prefill->SameRank(id);
    if (!source) Send(out, *peer, RoomFailedMsg{room.room, room.generation, true, record});
  }
}

// Every prefill rank of `room`'s dp (its sources and its witnesses) of the
// cp ranks that send (SendingCpRanks).
static std::vector<RankId> PrefillRanksOfDp(const ReceiverRoom& room, const ParallelInfo& info,
                                            bool all_cp) {
  std::vector<RankId> ranks;
  for (int cp = 0; cp < SendingCpRanks(info.attn_cp_size, all_cp); ++cp) {
    for (int pp = 0; pp < info.pp_size; ++pp) {
      for (int tp = 0; tp < info.attn_tp_size; ++tp) {
        RankId at;
        at.role = Role::kPrefill;
        at.dp = room.prefill_dp_rank;
        at.cp = cp;
        at.tp = tp;
        at.pp = pp;
        ranks.push_back(at);
      }
    }
  }
  return ranks;
}

// With sglang's server a decode rank also connects the prefill ranks of a
// room's dp that it reads nothing from (its witnesses): it detects their
// death itself and tells them when a room fails here (TellWitnessesLocked).
void ManagerImpl::EnsureWitnesses(const ReceiverRoom& room, const ParallelInfo& info) {
  for (const RankId& at : PrefillRanksOfDp(room, info, opts_.parallel.all_cp_ranks)) {
    {
      // Sources are connected already; a failed witness is looked up again
      // (it may have restarted) once a heartbeat interval at most.
      MutexLock lock(mu_);
      Peer* known = FindPeerLocked(PeerKey(at));
      if (known != nullptr &&
          (!known->failed || Now() - known->witness_lookup_at < opts_.heartbeat_interval))
        continue;
      if (known != nullptr) known->witness_lookup_at = Now();
    }
    RankId registered = at;
    Result<std::string> key = EnsurePrefillPeer(at, &registered);
    if (!key.ok())
      KVB_LOG_DEBUG("witness {} not connected: {}", at.ShortName(), key.status().ToString());
  }
}

bool ManagerImpl::WitnessesMetLocked(const ReceiverRoom& room, const ParallelInfo& info) {
  for (const RankId& at : PrefillRanksOfDp(room, info, opts_.parallel.all_cp_ranks)) {
    const Peer* known = FindPeerLocked(PeerKey(at));
    if (known == nullptr || known->failed) return false;
  }
  return true;
}

std::vector<ReceiverSource> ManagerImpl::KnownSourcesLocked(const ReceiverRoom& room) {
  std::vector<ReceiverSource> known;
  if (!prefill_info_) return known;  // no request resolved yet: no prefill rank is connected
  Result<std::vector<SourcePosition>> positions = SourcePositions(room, *prefill_info_);
  if (!positions.ok()) return known;
  for (const SourcePosition& at : *positions) {
    const Peer* peer = FindPeerLocked(PeerKey(at.position));
    if (peer != nullptr) known.push_back(SourceOf(*peer, at.dummy));
  }
  return known;
}

// A newer receiver holding `room`'s id for the same prefill dp rank (or one
// not yet initialized): the id is in use again.
static const ReceiverRoom* NewerUse(
    const std::unordered_map<uint64_t, std::shared_ptr<ReceiverRoom>>& receivers,
    const ReceiverRoom& room) {
  auto it = receivers.find(room.room);
  if (it == receivers.end() || it->second.get() == &room) return nullptr;
  const ReceiverRoom& next = *it->second;
  if (next.generation <= room.generation) return nullptr;
  if (next.initialized && next.prefill_dp_rank != room.prefill_dp_rank) return nullptr;
  return &next;
}

void ManagerImpl::AddFailedSourcesLocked(ReceiverRoom& room, std::vector<ReceiverSource> sources,
                                         Outbox& out) {
  // A prefill rank told of this failure before decode's metadata fails its
  // sender of the room: once the id is in use again, that sender may be the
  // new request's, which it cannot tell apart before the new metadata. So
  // prefill ranks not told yet are not told; a sender of the failed use, if
  // one is still waiting, ends at its deadline. Nothing was sent to them for
  // this use (it never resolved), so nothing of theirs can land here.
  if (const ReceiverRoom* next = NewerUse(receivers_, room); next != nullptr && !sources.empty()) {
    KVB_LOG_WARN(
        "room {}: the use that failed ({}) is not told to its prefill ranks: it failed before "
        "they were known, and the room id is in use again (generation {})",
        room.room, room.failure->Message(), next->generation);
    return;
  }
  for (ReceiverSource& src : sources) {
    const bool known =
        std::any_of(room.sources.begin(), room.sources.end(),
                    [&](const ReceiverSource& s) { return s.peer_key == src.peer_key; });
    if (known) continue;
    TellSourceLocked(room, src, *room.failure, out);
    room.sources.push_back(std::move(src));
  }
}

void ManagerImpl::UpdateQuiescedLocked(ReceiverRoom& room) {
  if (room.quiesced.load()) return;
  bool q = room.poll() == KVPoll::kSuccess;
  if (!q && room.failure) {
    q = std::all_of(room.sources.begin(), room.sources.end(),
                    [](const ReceiverSource& s) { return s.quiesced; });
  }
  if (q) {
    room.quiesced.store(true, std::memory_order_release);
    room_records_cv_.notify_all();  // WaitReceiverQuiesced
  }
}

void ManagerImpl::SettleSourcesOfLocked(const Peer& peer) {
  for (auto& [id, room] : receivers_) {
    bool touched = false;
    for (ReceiverSource& src : room->sources) {
      if (src.peer_key != peer.key || src.prefill->incarnation != peer.id->incarnation ||
          src.quiesced)
        continue;
      touched = SettleSourceLocked(*room, src, &peer) || touched;
    }
    if (touched) UpdateQuiescedLocked(*room);
  }
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
