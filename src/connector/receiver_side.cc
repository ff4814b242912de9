// Decode side of the connector: KVReceiver's state machine.
#include <fmt/format.h>

#include <algorithm>

#include "common/log.h"
#include "connector/layout_json.h"
#include "connector/manager_impl.h"
#include "connector/record_tag.h"
#include "connector/relay_rule.h"

namespace kvbridge::internal {

// Whether a dead rank's record is of the prefill instance (dp) `room` reads from.
static bool OfSourceInstance(const FailureRecord& dead, const ReceiverRoom& room) {
  return dead.origin.role == Role::kPrefill && dead.origin.dp == room.prefill_dp_rank;
}

Result<std::shared_ptr<ReceiverRoom>> ManagerImpl::NewReceiver(uint64_t room) {
  if (hooks_.manual_ticks) ForgetRestartedRanks();  // else a registry check (restart_check.cc)
  Outbox out;
  std::shared_ptr<ReceiverRoom> r;
  bool check = false;
  {
    MutexLock lock(mu_);
    auto it = receivers_.find(room);
    if (it != receivers_.end() && it->second->live)
      return FailedPreconditionError(
          fmt::format("room {} already has a live receiver "
                      "(generation {})",
                      room, it->second->generation));
    r = std::make_shared<ReceiverRoom>(room, ++next_generation_, Now(), WallNow());
    receivers_[room] = r;
    if (auto blocker = NewRoomBlockerLocked()) check = BlockNewRoomLocked(*r, *blocker, out);
  }
  Flush(out);
  if (check) WakeRegistryRound();
  return r;
}

void ManagerImpl::ReleaseReceiver(const std::shared_ptr<ReceiverRoom>& room) {
  KVPoll p = room->poll();
  if (p != KVPoll::kSuccess && p != KVPoll::kFailed) ReceiverAbort(room);
  MutexLock lock(mu_);
  room->live = false;
  auto it = receivers_.find(room->room);
  if (it != receivers_.end() && it->second == room) receivers_.erase(it);
}

std::optional<FailureRecord> ManagerImpl::ReceiverFailure(const ReceiverRoom& room) const {
  MutexLock lock(mu_);
  if (!room.failure) return std::nullopt;
  return *room.failure;
}

Status ManagerImpl::ReceiverInit(const std::shared_ptr<ReceiverRoom>& room, int prefill_dp_rank) {
  Outbox out;
  bool resolve = false;  // not from what this rank holds: by the resolver
  const Status checked = [&]() -> Status {
    MutexLock lock(mu_);
    if (room->failure) {
      // Failed at creation (e.g. a dead sibling): the prefill ranks of this
      // request still learn why.
      if (!room->initialized && prefill_dp_rank >= 0) {
        room->initialized = true;
        room->prefill_dp_rank = prefill_dp_rank;
        AddFailedSourcesLocked(*room, KnownSourcesLocked(*room), out);
        UpdateQuiescedLocked(*room);
      }
      return room->failure->ToStatus();
    }
    Status bad;
    if (room->initialized) {
      bad = FailedPreconditionError(fmt::format("room {}: Init called twice", room->room));
    } else if (prefill_dp_rank < 0) {
      bad = InvalidArgumentError(
          fmt::format("room {}: prefill dp rank {} < 0", room->room, prefill_dp_rank));
    }
    if (!bad.ok()) {
      FailReceiverLocked(*room,
                         MakeRecord(Self(), FailureCause::kInvalidRequest, bad.message(),
                                    Phase::kBootstrapping, "argument check"),
                         out);
      return bad;
    }
    room->initialized = true;
    room->prefill_dp_rank = prefill_dp_rank;
    room->phase_since = Now();
    if (!ResolveFromKnownLocked(*room, out)) {
      unresolved_.push_back(room);  // the resolver's (RetryUnresolved) until resolved
      resolve = true;
    }
    return Status();
  }();
  Flush(out);
  if (!checked.ok() || !resolve) return checked;
  // Lookups and connects wait on the network: the resolver thread makes
  // them, at once. With CoreHooks::manual_ticks there is none, and the
  // caller's thread does.
  if (hooks_.manual_ticks) {
    ResolveSources(room).IgnoreError();  // a failure fails the room
  } else {
    WakeResolver();
  }
  return Status();
}

bool ManagerImpl::ResolveFromKnownLocked(ReceiverRoom& room, Outbox& out) {
  if (!prefill_info_) return false;
  // Whether a dead rank of the instance restarted takes a lookup
  // (FailIfSourceInstanceDead).
  for (const auto& [key, r] : dead_ranks_)
    if (OfSourceInstance(r, room)) return false;
  Result<std::vector<SourcePosition>> positions = SourcePositions(room, *prefill_info_);
  if (!positions.ok()) return false;  // the resolver fails the room, saying why
  std::vector<ReceiverSource> sources;
  for (const SourcePosition& at : *positions) {
    const Peer* peer = FindPeerLocked(PeerKey(at.position));
    if (peer == nullptr || !peer->ready || peer->failed) return false;
    sources.push_back(SourceOf(*peer, at.dummy));
  }
  if (sglang_registry_ && !WitnessesMetLocked(room, *prefill_info_)) return false;
  AdoptSourcesLocked(room, std::move(sources), out);
  return true;
}

Status ManagerImpl::ResolveSources(const std::shared_ptr<ReceiverRoom>& room) {
  std::lock_guard<std::mutex> resolve(resolve_mu_);
  std::optional<RankId> about;  // the prefill rank that does not fit or did not answer
  Status s = [&]() -> Status {
    Result<ParallelInfo> asked = PrefillParallelInfo();
    if (!asked.ok()) return AnsweredWrongly(asked.status());  // the registry's answer
    const ParallelInfo info = std::move(asked).value();
    KVB_RETURN_IF_ERROR(FailIfSourceInstanceDead(room));
    KVB_ASSIGN_OR_RETURN(std::vector<SourcePosition> positions, SourcePositions(*room, info));
    std::vector<ReceiverSource> sources;
    for (const SourcePosition& at : positions) {
      RankId registered = at.position;  // the registry's record of that rank, when read
      Result<std::string> key = EnsurePrefillPeer(at.position, &registered);
      if (!key.ok()) {
        // About that prefill rank: its layout does not fit, or the registry
        // answered (it has a host) and the rank did not, or not as a rank.
        const StatusCode code = key.status().code();
        if (code == StatusCode::kFailedPrecondition || code == StatusCode::kUnauthenticated ||
            ((code == StatusCode::kUnavailable || code == StatusCode::kDataLoss) &&
             !registered.host.empty()))
          about = registered;
        return key.status();
      }
      MutexLock lock(mu_);
      sources.push_back(SourceOf(*FindPeerLocked(*key), at.dummy));
    }
    AdoptSources(*room, std::move(sources));
    if (sglang_registry_) EnsureWitnesses(*room, info);
    return Status();
  }();
  if (!s.ok()) FailUnresolved(*room, s, about);
  return s;
}

Result<ParallelInfo> ManagerImpl::PrefillParallelInfo() {
  {
    MutexLock lock(mu_);
    if (prefill_info_) return *prefill_info_;
  }
  KVB_ASSIGN_OR_RETURN(ParallelInfo fetched, registry_->GetParallelInfo());
  if (!fetched.complete())
    return UnavailableError(fmt::format("{} of {} prefill ranks registered",
                                        fetched.ranks_registered, fetched.ranks_expected));
  MutexLock lock(mu_);
  prefill_info_ = fetched;
  return fetched;
}

Status ManagerImpl::FailIfSourceInstanceDead(const std::shared_ptr<ReceiverRoom>& room) {
  struct Dead {
    std::string key;
    FailureRecord record;
    bool look_up = true;  // whether it may have restarted
  };
  std::vector<Dead> dead;
  {
    MutexLock lock(mu_);
    for (const auto& [key, r] : dead_ranks_) {
      if (!OfSourceInstance(r, *room)) continue;
      // With sglang's server the lookup reads the rank's own endpoint: for
      // a rank cut off on another host it would wait for the client's
      // timeout on every request. Until its host answered the resolver
      // (MeetPrefillAgain, which told it), it is taken as not restarted.
      const Peer* p = FindPeerLocked(key);
      const bool unreached =
          sglang_registry_ && p != nullptr && CutOffLocked(*p) && p->told_failed_at == SteadyTime{};
      dead.push_back({key, r, !unreached});
    }
  }
  // A restart the registry holds may not be in this client's copy of it
  // yet (etcd's watch lags by milliseconds): a request that follows the
  // restart must not fail on the old incarnation's record. Every failed
  // peer but one whose layout did not fit is in dead_ranks_, so the
  // EnsurePrefillPeer that follows reads the caught-up copy too.
  if (std::any_of(dead.begin(), dead.end(), [](const Dead& d) { return d.look_up; }))
    registry_->CatchUp().IgnoreError();  // else: the copy as it is
  for (const Dead& d : dead) {
    const FailureRecord& r = d.record;
    // Restarted only by a record its rank tagged (record_tag.h).
    Result<RankRecord> now = d.look_up ? LookUpTaggedRank(*registry_, *handshake_, r.origin.dp,
                                                          r.origin.cp, r.origin.tp, r.origin.pp)
                                       : Result<RankRecord>(UnavailableError("not reached"));
    if (now.ok() && now->incarnation != r.origin.incarnation) {
      MutexLock lock(mu_);
      dead_ranks_.erase(d.key);  // restarted
      continue;
    }
    Outbox out;
    {
      MutexLock lock(mu_);
      FailReceiverLocked(*room, r, out);
    }
    Flush(out);
    return r.ToStatus();
  }
  return Status();
}

Result<std::vector<SourcePosition>> ManagerImpl::SourcePositions(const ReceiverRoom& room,
                                                                 const ParallelInfo& info) const {
  if (room.prefill_dp_rank >= info.attn_dp_size)
    return InvalidArgumentError(fmt::format("prefill dp rank {} out of range [0, {})",
                                            room.prefill_dp_rank, info.attn_dp_size));
  KVB_ASSIGN_OR_RETURN(std::vector<HeadSlice> flows,
                       ComputeFlows(info.attn_tp_size, layout_.tp_size, layout_.total_kv_heads,
                                    layout_.is_mla, StateSlicedFor(layout_, info.attn_tp_size)));
  std::vector<std::pair<int, bool>> ranks;  // prefill tp rank, dummy
  for (const HeadSlice& f : FlowsToDecode(flows, self_.tp)) {
    if (std::find(ranks.begin(), ranks.end(), std::pair{f.prefill_rank, false}) == ranks.end())
      ranks.emplace_back(f.prefill_rank, false);
  }
  for (int p = 0; p < info.attn_tp_size; ++p) {
    if (FlowsFromPrefill(flows, p).empty() && p % layout_.tp_size == self_.tp)
      ranks.emplace_back(p, true);
  }
  KVB_ASSIGN_OR_RETURN(std::vector<int> stages,
                       PrefillStagesOfDecode(info.pp_size, opts_.parallel.pp_size, self_.pp));
  const int cp_ranks = SendingCpRanks(info.attn_cp_size, opts_.parallel.all_cp_ranks);
  std::vector<SourcePosition> positions;
  for (int cp = 0; cp < cp_ranks; ++cp) {
    for (int pp : stages) {
      for (auto [tp, dummy] : ranks) {
        SourcePosition at;
        at.position.role = Role::kPrefill;
        at.position.dp = room.prefill_dp_rank;
        at.position.cp = cp;
        at.position.tp = tp;
        at.position.pp = pp;
        at.dummy = dummy;
        positions.push_back(at);
      }
    }
  }
  return positions;
}

void ManagerImpl::AdoptSources(ReceiverRoom& room, std::vector<ReceiverSource> sources) {
  Outbox out;
  {
    MutexLock lock(mu_);
    AdoptSourcesLocked(room, std::move(sources), out);
  }
  Flush(out);
}

void ManagerImpl::AdoptSourcesLocked(ReceiverRoom& room, std::vector<ReceiverSource> sources,
                                     Outbox& out) {
  if (room.resolved) return;
  if (room.failure) {  // failed while this resolve was under way
    AddFailedSourcesLocked(room, std::move(sources), out);
    room.resolved = true;
    UpdateQuiescedLocked(room);
    return;
  }
  room.sources = std::move(sources);
  room.resolved = true;
  room.last_resolve_error.reset();
  // The handshakes (and the waiting deadline that names them) start now,
  // not at Init: a prefill instance that completed late is not blamed for
  // the time before it could be asked.
  if (room.poll() == KVPoll::kBootstrapping) room.phase_since = Now();
  if (room.meta) {
    SendMetaLocked(room, out);
  } else {
    MaybeHandshakeDoneLocked(room);
  }
}

void ManagerImpl::FailUnresolved(ReceiverRoom& room, const Status& s,
                                 const std::optional<RankId>& about) {
  Outbox out;
  {
    MutexLock lock(mu_);
    if (s.ok()) {
      room.last_resolve_error.reset();
    } else {
      room.last_resolve_error = ReceiverRoom::ResolveError{
          s, s.code() == StatusCode::kUnavailable ? about : std::nullopt};
    }
    if (s.code() != StatusCode::kUnavailable && s.code() != StatusCode::kNotFound) {
      // A record whose address tag does not check (record_tag.h): about
      // the prefill rank it names, as a layout that does not fit is.
      const bool untagged = s.code() == StatusCode::kUnauthenticated;
      // The registry, or the rank endpoint it listed (`about` has its host),
      // answered what no registry or rank would (AnsweredWrongly): about
      // that one, never a caller bug of this rank.
      const bool garbled = s.code() == StatusCode::kDataLoss;
      const bool by_rank = garbled && about && !about->host.empty();
      FailureCause cause = s.code() == StatusCode::kFailedPrecondition
                               ? FailureCause::kLayoutMismatch
                           : untagged ? FailureCause::kUnauthenticated
                           : by_rank  ? FailureCause::kPeerUnreachable
                           : garbled  ? FailureCause::kRegistryLost
                                      : FailureCause::kInvalidRequest;
      RankId origin = Self();
      if (garbled) origin = RankId{.role = Role::kBootstrap, .host = registry_->address()};
      if (cause == FailureCause::kLayoutMismatch || untagged || by_rank) {
        // The prefill rank whose layout does not fit; for a mismatch of the
        // two instances' shapes (e.g. pp sizes), the instance's first rank.
        // Never this decode rank's tp/pp under a prefill role: that names a
        // rank that may not exist.
        origin = about.value_or(RankId{});
        origin.role = Role::kPrefill;
        origin.dp = room.prefill_dp_rank;
      }
      FailReceiverLocked(room,
                         MakeRecord(origin, cause, s.message(), Phase::kBootstrapping,
                                    untagged  ? "registry record check"
                                    : garbled ? "bootstrap lookup"
                                              : "layout check"),
                         out);
    } else {
      // A known peer that is dead: fail now instead of waiting for the
      // deadline. Not one retired by this rank's rejoin: its record is this
      // rank's own (RetirePeersLocked), and the lookup that failed was of
      // whatever is at that position now; it is tried again.
      for (auto& [key, peer] : peers_) {
        if (peer->retired || !peer->failed || !peer->failure ||
            peer->failure->origin.SameRank(Self()))
          continue;
        if (s.message().find(key) != std::string::npos) {
          FailReceiverLocked(room, *peer->failure, out);
          break;
        }
      }
    }
  }
  Flush(out);
}

Status ManagerImpl::ReceiverSendMetadata(const std::shared_ptr<ReceiverRoom>& room,
                                         std::span<const int32_t> pages, int64_t aux_index,
                                         std::span<const int32_t> state,
                                         int64_t decode_prefix_len) {
  Outbox out;
  Status bad;
  {
    MutexLock lock(mu_);
    if (room->failure) return room->failure->ToStatus();
    int64_t aux_rows = INT64_MAX;
    for (const auto& b : layout_.aux) aux_rows = std::min<int64_t>(aux_rows, b.length / b.item_len);
    if (!room->initialized) {
      bad = FailedPreconditionError(fmt::format("room {}: SendMetadata before Init", room->room));
    } else if (room->meta_given) {
      bad = FailedPreconditionError(fmt::format("room {}: SendMetadata called twice", room->room));
    } else if (!layout_.aux.empty() && (aux_index < 0 || aux_index >= aux_rows)) {
      bad = InvalidArgumentError(fmt::format("room {}: aux index {} out of range [0, {})",
                                             room->room, aux_index, aux_rows));
    } else if (decode_prefix_len < 0 ||
               decode_prefix_len % (int64_t{layout_.page_size} * layout_.dcp_size) != 0) {
      bad = InvalidArgumentError(fmt::format(
          "room {}: decode prefix length {} is not a non-negative multiple of {} {}", room->room,
          decode_prefix_len, int64_t{layout_.page_size} * layout_.dcp_size,
          layout_.dcp_size > 1 ? "(page size x dcp size, the virtual page)" : "(the page size)"));
    } else {
      bad = CheckPageIndices(layout_, pages, /*unique=*/true);
      // No state buffers: the indices are moot (prefill plans nothing).
      if (bad.ok() && !layout_.state.empty())
        bad = CheckStateSlots("state index", layout_.state, layout_.state_types, state);
    }
    if (!bad.ok()) {
      FailReceiverLocked(*room,
                         MakeRecord(Self(), FailureCause::kInvalidRequest, bad.message(),
                                    room->phase, "argument check"),
                         out);
    } else {
      MetaMsg m;
      m.room = room->room;
      m.generation = room->generation;
      m.decode_tp_size = layout_.tp_size;
      m.pages.assign(pages.begin(), pages.end());
      m.aux_index = aux_index;
      m.state.assign(state.begin(), state.end());
      m.prefix_pages = decode_prefix_len / layout_.page_size;
      room->meta = std::move(m);
      room->meta_given = true;
      if (room->resolved) SendMetaLocked(*room, out);
    }
  }
  Flush(out);
  return bad;
}

void ManagerImpl::SendMetaLocked(ReceiverRoom& room, Outbox& out) {
  for (ReceiverSource& src : room.sources) {
    Peer* peer = FindPeerLocked(src.peer_key);
    if (peer == nullptr || peer->failed) {
      FailureRecord r = peer != nullptr && peer->failure
                            ? *peer->failure
                            : MakeRecord(src.prefill, FailureCause::kPeerUnreachable,
                                         "not connected", Phase::kBootstrapping, "connect");
      r.generation = room.generation;
      FailReceiverLocked(room, r, out);
      return;
    }
  }
  for (ReceiverSource& src : room.sources) {
    MetaMsg m = *room.meta;
    if (src.dummy) {
      m.dummy = true;
      m.pages.clear();
      m.state.clear();
      m.aux_index = -1;
    }
    Peer& peer = *FindPeerLocked(src.peer_key);
    Send(out, peer, m);
    src.meta_sent = true;
    src.session = peer.session;
    SettleSourceLocked(room, src, FindPeerLocked(src.peer_key));  // a dummy: never writes
  }
  room.meta.reset();  // every source has it (the Send above queued a copy)
  room.phase = Phase::kWaitingForInput;
  room.phase_since = Now();
  room.meta_sent_at = room.phase_since;
  changes_.Set(room, KVPoll::kWaitingForInput);
}

void ManagerImpl::OnNotify(const RankId& from, const NotifyMsg& msg, Outbox& out) {
  auto it = receivers_.find(msg.room);
  if (it == receivers_.end() || it->second->generation != msg.generation) {
    ++stale_dropped_;
    return;
  }
  ReceiverRoom& room = *it->second;
  if (room.failure || room.poll() == KVPoll::kSuccess) {
    ++stale_dropped_;
    return;
  }
  const std::string key = PeerKey(from);
  auto src = std::find_if(room.sources.begin(), room.sources.end(),
                          [&](const ReceiverSource& s) { return s.peer_key == key; });
  if (src == room.sources.end() || src->prefill->incarnation != from.incarnation || src->dummy) {
    ++stale_dropped_;
    return;
  }
  if (msg.chunk != src->next_chunk || src->last_received) {
    FailReceiverLocked(room,
                       MakeRecord(from, FailureCause::kInvalidRequest,
                                  fmt::format("chunk {} arrived while chunk {} was expected",
                                              msg.chunk, src->next_chunk),
                                  Phase::kTransferring, "notification check"),
                       out);
    return;
  }
  ++src->next_chunk;
  src->last_received = msg.last;
  room.phase = Phase::kTransferring;
  room.phase_since = Now();
  bool done = std::all_of(room.sources.begin(), room.sources.end(),
                          [](const ReceiverSource& s) { return s.dummy || s.last_received; });
  if (done) {
    room.phase = Phase::kDone;  // every write landed: the write rule's kDone
    for (ReceiverSource& s : room.sources) SettleSourceLocked(room, s, FindPeerLocked(s.peer_key));
    room.quiesced.store(true, std::memory_order_release);
    // Awaiting its restart check, it stays Transferring: the check may
    // still fail it, and Success is final (SettleRestartChecks).
    if (room.restart_check == 0) {
      SucceedReceiverLocked(room);
      return;
    }
  }
  changes_.Set(room, KVPoll::kTransferring);
}

void ManagerImpl::SucceedReceiverLocked(ReceiverRoom& room) {
  ++succeeded_;
  if (metrics_)
    metrics_->Finished(true, std::chrono::duration<double>(Now() - room.created).count());
  changes_.Set(room, KVPoll::kSuccess);
}

void ManagerImpl::OnPrefillRoomFailed(const RankId& from, const RoomFailedMsg& msg, Outbox& out) {
  auto it = receivers_.find(msg.room);
  if (msg.generation == 0 && sglang_registry_) {  // relayed (RelayRoomFailureLocked)
    const ReceiverRoom* held = it == receivers_.end() ? nullptr : it->second.get();
    if (auto why = RelayedRecordRefusal(from, msg, held)) {
      ++invalid_dropped_;
      KVB_LOG_WARN("dropping a relayed failure of room {} from {}: {}", msg.room, from.ToString(),
                   *why);
      return;
    }
    ApplyRoomFailureLocked(msg.record, out);
    return;
  }
  if (it == receivers_.end() || it->second->generation != msg.generation) {
    ++stale_dropped_;
    return;
  }
  ReceiverRoom& room = *it->second;
  const std::string key = PeerKey(from);
  // Only a source of this request may fail it here (others reach it
  // relayed, checked above, or through the registry): a prefill rank of
  // another dp or instance that learned the generation has no part in it.
  const bool source =
      std::any_of(room.sources.begin(), room.sources.end(), [&](const ReceiverSource& s) {
        return s.peer_key == key && s.prefill->incarnation == from.incarnation;
      });
  if (!source) {
    ++invalid_dropped_;
    KVB_LOG_WARN("dropping a failure of room {} from {}: not a source of that request", msg.room,
                 from.ToString());
    return;
  }
  for (ReceiverSource& s : room.sources) {
    if (s.peer_key != key) continue;
    s.told = true;
    s.said_quiesced = s.said_quiesced || msg.quiesced;
    SettleSourceLocked(room, s, FindPeerLocked(key));
  }
  FailReceiverLocked(room, msg.record, out);
  UpdateQuiescedLocked(room);
}

void ManagerImpl::OnQuiesced(const RankId& from, const QuiescedMsg& msg, Outbox& out) {
  auto it = receivers_.find(msg.room);
  if (it == receivers_.end() || it->second->generation != msg.generation) {
    ++stale_dropped_;
    return;
  }
  const std::string key = PeerKey(from);
  for (ReceiverSource& s : it->second->sources) {
    if (s.peer_key != key) continue;
    s.said_quiesced = true;
    SettleSourceLocked(*it->second, s, FindPeerLocked(key));
  }
  UpdateQuiescedLocked(*it->second);
}

void ManagerImpl::ReceiverAbort(const std::shared_ptr<ReceiverRoom>& room, FailureCause cause,
                                std::string detail, const char* mechanism) {
  Outbox out;
  {
    MutexLock lock(mu_);
    FailReceiverLocked(*room, MakeRecord(Self(), cause, std::move(detail), room->phase, mechanism),
                       out);
  }
  Flush(out);
}

}  // namespace kvbridge::internal
