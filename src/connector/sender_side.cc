// Prefill side of the connector: KVSender's state machine.
#include <fmt/format.h>

#include <algorithm>

#include "common/log.h"
#include "connector/manager_impl.h"
#include "connector/rank_failure_rule.h"

namespace kvbridge::internal {

// Decode's page list against the pages prefill sends after its prefix: one
// per page, or under decode context parallelism (`decode`, when known) one
// per dcp_size.
static Status CheckDestinationCount(int rank, const SenderFlow& flow, int64_t num_pages,
                                    const RankLayout* decode) {
  const int64_t sent = num_pages - flow.meta.prefix_pages;
  if (sent < 0)
    return InvalidArgumentError(
        fmt::format("decode tp{}'s prefix of {} pages is longer than the request's {}", rank,
                    flow.meta.prefix_pages, num_pages));
  const int dcp = decode != nullptr ? decode->dcp_size : 1;
  const int64_t want = decode != nullptr ? DestinationPageCount(*decode, sent) : sent;
  if (static_cast<int64_t>(flow.meta.pages.size()) == want) return Status();
  return InvalidArgumentError(fmt::format(
      "decode tp{} sent {} destination pages, prefill has {} to send{}", rank,
      flow.meta.pages.size(), sent, dcp > 1 ? fmt::format(" (one per {} under dcp)", dcp) : ""));
}

namespace {

std::string PendingLimitDetail(const SenderInbox& inbox, size_t max_pending) {
  return fmt::format(
      "{} requests' metadata ({} page and state indices) already wait for a sender on this rank "
      "(at most ManagerOptions::max_pending_requests = {}, {} indices): is this prefill rank "
      "getting the requests decode sends it?",
      inbox.held_metadata(), inbox.held_entries(), max_pending, SenderInbox::kMaxHeldEntries);
}

// KVSender::Timing(): the system's steady clock, which the application
// compares with its own (not the core's Clock).
int64_t SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t Rows(const std::vector<BufferSpan>& bufs) {
  int64_t rows = INT64_MAX;
  for (const auto& b : bufs) rows = std::min<int64_t>(rows, b.length / b.item_len);
  return bufs.empty() ? 0 : rows;
}

}  // namespace

Result<std::shared_ptr<SenderRoom>> ManagerImpl::NewSender(uint64_t room) {
  if (hooks_.manual_ticks) ForgetRestartedRanks();  // else a registry check (restart_check.cc)
  Outbox out;
  std::shared_ptr<SenderRoom> r;
  bool check = false;
  {
    MutexLock lock(mu_);
    auto it = senders_.find(room);
    if (it != senders_.end() && it->second->live)
      return FailedPreconditionError(fmt::format("room {} already has a live sender", room));
    r = std::make_shared<SenderRoom>(room, Now(), WallNow());
    r->cp_dummy = self_.role == Role::kPrefill &&
                  self_.cp >= SendingCpRanks(opts_.parallel.cp_size, opts_.parallel.all_cp_ranks);
    senders_[room] = r;
    SenderInbox::ForNewSender waiting = inbox_.TakeForNewSender(room);
    if (auto blocker = NewRoomBlockerLocked()) check = BlockNewRoomLocked(*r, *blocker, out);
    for (auto& [tp, abort] : waiting.aborts) {
      FailSenderLocked(*r, abort.record, out);
      r->aborted_generations[tp] = abort.generation;
    }
    for (PendingMeta& meta : waiting.metas)
      AdoptMetaLocked(*r, meta.from, std::move(meta.meta), out);
    if (r->cp_dummy) UpdateSenderStateLocked(*r);  // WaitingForInput at once
  }
  Flush(out);
  if (check) WakeRegistryRound();
  return r;
}

void ManagerImpl::ReleaseSender(const std::shared_ptr<SenderRoom>& room) {
  KVPoll p = room->poll();
  if (p != KVPoll::kSuccess && p != KVPoll::kFailed) SenderAbort(room);
  MutexLock lock(mu_);
  room->live = false;
  std::vector<std::pair<int, uint64_t>> flows;
  for (const auto& [tp, flow] : room->flows) flows.emplace_back(tp, flow.meta.generation);
  KeepReleasedWritingLocked(room);
  const FailureRecord* failed_before_meta =
      room->failure && room->flows.empty() ? &*room->failure : nullptr;
  inbox_.OnSenderReleased(room->room, flows, failed_before_meta, room->aborted_generations, Now());
  auto it = senders_.find(room->room);
  if (it != senders_.end() && it->second == room) senders_.erase(it);
}

std::optional<FailureRecord> ManagerImpl::SenderFailure(const SenderRoom& room) const {
  MutexLock lock(mu_);
  if (!room.failure) return std::nullopt;
  return *room.failure;
}

Status ManagerImpl::SenderInit(SenderRoom& room, int64_t num_pages, int64_t aux_index) {
  Outbox out;
  Status result;
  {
    MutexLock lock(mu_);
    if (room.failure) return room.failure->ToStatus();
    if (room.initialized) {
      result = FailedPreconditionError(fmt::format("room {}: Init called twice", room.room));
    } else if (num_pages < 0) {
      result = InvalidArgumentError(fmt::format("room {}: num_pages {} < 0", room.room, num_pages));
    } else if (!layout_.aux.empty() && (aux_index < 0 || aux_index >= Rows(layout_.aux))) {
      result = InvalidArgumentError(fmt::format("room {}: aux index {} out of range [0, {})",
                                                room.room, aux_index, Rows(layout_.aux)));
    } else {
      room.initialized = true;
      room.num_pages = num_pages;
      room.aux_index = aux_index;
      for (auto& [rank, flow] : room.flows) {
        const Peer* peer = FindPeerLocked(flow.peer_key);
        if (flow.slice) {
          result = CheckDestinationCount(rank, flow, num_pages, peer ? &peer->layout : nullptr)
                       .WithContext(fmt::format("room {}", room.room));
          if (!result.ok()) break;
        }
      }
    }
    if (!result.ok()) {
      FailSenderLocked(room,
                       MakeRecord(Self(), FailureCause::kInvalidRequest, result.message(),
                                  room.phase, "argument check"),
                       out);
    } else {
      UpdateSenderStateLocked(room);
    }
  }
  Flush(out);
  return result;
}

Status ManagerImpl::SenderSend(const std::shared_ptr<SenderRoom>& sp,
                               std::span<const int32_t> pages, std::span<const int32_t> state) {
  SenderRoom& room = *sp;
  Outbox out;
  Status result;
  {
    MutexLock lock(mu_);
    if (room.failure) return room.failure->ToStatus();
    const int64_t n = static_cast<int64_t>(pages.size());
    result = CheckSendLocked(room, pages, state);
    const bool last = result.ok() && room.pages_sent + n == room.num_pages;
    std::vector<std::pair<int, Outbox::Post>> posts;  // by decode rank
    for (auto& [rank, flow] : room.flows) {
      if (!result.ok()) break;
      if (!flow.slice || flow.closed) continue;
      Result<Outbox::Post> post = PlanFlowChunkLocked(sp, rank, flow, pages, state, last);
      if (!post.ok()) {
        result = post.status();
        break;
      }
      posts.emplace_back(rank, std::move(post).value());
    }
    if (!result.ok()) {
      FailureCause cause = result.code() == StatusCode::kUnavailable
                               ? FailureCause::kPeerUnreachable
                               : FailureCause::kInvalidRequest;
      FailSenderLocked(
          room, MakeRecord(Self(), cause, result.message(), room.phase, "argument check"), out);
    } else {
      CommitChunkLocked(room, std::move(posts), n, last, out);
    }
  }
  Flush(out);
  return result;
}

Status ManagerImpl::CheckSendLocked(const SenderRoom& room, std::span<const int32_t> pages,
                                    std::span<const int32_t> state) const {
  const int64_t n = static_cast<int64_t>(pages.size());
  if (!room.initialized)
    return FailedPreconditionError(fmt::format("room {}: Send before Init", room.room));
  if (room.last_posted)
    return FailedPreconditionError(fmt::format(
        "room {}: Send after the last chunk (all {} pages sent)", room.room, room.num_pages));
  if (room.poll() == KVPoll::kBootstrapping)
    return FailedPreconditionError(
        fmt::format("room {}: Send before metadata from every decode rank arrived", room.room));
  if (room.pages_sent + n > room.num_pages)
    return InvalidArgumentError(
        fmt::format("room {}: chunk of {} pages exceeds num_pages {} ({} already sent)", room.room,
                    n, room.num_pages, room.pages_sent));
  KVB_RETURN_IF_ERROR(CheckPageIndices(layout_, pages, /*unique=*/false));
  return CheckStateSlots("state index", layout_.state, layout_.state_types, state);
}

Result<Outbox::Post> ManagerImpl::PlanFlowChunkLocked(const std::shared_ptr<SenderRoom>& sp,
                                                      int rank, const SenderFlow& flow,
                                                      std::span<const int32_t> pages,
                                                      std::span<const int32_t> state, bool last) {
  const SenderRoom& room = *sp;
  Peer* peer = FindPeerLocked(flow.peer_key);
  if (peer == nullptr || peer->failed)
    return UnavailableError(fmt::format("decode tp{} is not connected", rank));
  std::vector<int32_t> src, dst;
  const bool dcp = peer->layout.dcp_size > 1;  // token by token (PlanKvDcpTokens)
  // Every cp rank transferring: this rank's share of the pages after the prefix.
  const PageShare own = opts_.parallel.all_cp_ranks
                            ? CpPageShare(room.num_pages - flow.meta.prefix_pages,
                                          opts_.parallel.cp_size, opts_.parallel.cp_rank)
                            : PageShare{0, room.num_pages};
  int64_t first_page = -1;  // of the pages this chunk sends, after the prefix
  for (size_t i = 0; i < pages.size(); ++i) {
    int64_t pos = room.pages_sent + static_cast<int64_t>(i);
    if (pos < flow.meta.prefix_pages) continue;
    const int64_t rel = pos - flow.meta.prefix_pages;
    if (rel < own.first || rel >= own.first + own.count) continue;
    if (first_page < 0) first_page = rel;
    src.push_back(pages[i]);
    if (dcp) continue;
    if (rel >= static_cast<int64_t>(flow.meta.pages.size()))  // Init and Meta checked the count
      return InvalidArgumentError(
          fmt::format("decode tp{} gave no page for position {}", rank, rel));
    dst.push_back(flow.meta.pages[rel]);
  }
  // A flow of no heads carries state slices only (ComputeFlows).
  std::vector<CopyRun> runs;
  if (flow.slice->num_heads > 0) {
    KVB_ASSIGN_OR_RETURN(runs, dcp ? PlanKvDcpTokens(layout_, peer->layout, src, flow.meta.pages,
                                                     std::max<int64_t>(first_page, 0))
                                   : PlanKvPages(layout_, peer->layout, *flow.slice, src, dst));
  }
  if (last && flow.carries_state && flow.last_stage_read && room.aux_index >= 0 &&
      flow.meta.aux_index >= 0 && !layout_.aux.empty()) {
    KVB_ASSIGN_OR_RETURN(std::vector<CopyRun> aux,
                         PlanAux(layout_, peer->layout, room.aux_index, flow.meta.aux_index));
    runs.insert(runs.end(), aux.begin(), aux.end());
  }
  // Whole state buffers from one flow per decode rank, slices of sharded
  // ones from every flow (each its share); a stage before the last that
  // decode rank reads sends only the buffers paired by layer id (its own
  // layers').
  if (last && (!state.empty() || !flow.meta.state.empty())) {
    KVB_ASSIGN_OR_RETURN(
        std::vector<CopyRun> st,
        PlanState(layout_, peer->layout, state, flow.meta.state,
                  StateShare{.whole = flow.carries_state,
                             .slices = self_.cp == 0,  // every cp rank holds the same state
                             .last_stage = flow.last_stage_read}));
    runs.insert(runs.end(), st.begin(), st.end());
  }
  NotifyMsg note{room.room, flow.meta.generation, flow.next_chunk, last,
                 static_cast<uint32_t>(src.size())};
  // The last notice waits for the writes' completion (SenderFlow::final_note).
  return Outbox::Post{peer->tpeer, peer->remote, std::move(runs),
                      last ? std::string() : EncodeMessage(Self(), note),
                      [this, keep = sp, rank](const Status& s, uint64_t bytes, uint64_t ops) {
                        OnChunkDone(keep, rank, s, bytes, ops);
                      }};
}

void ManagerImpl::CommitChunkLocked(SenderRoom& room,
                                    std::vector<std::pair<int, Outbox::Post>> posts, int64_t n,
                                    bool last, Outbox& out) {
  if (!posts.empty() && room.first_write_ns.load(std::memory_order_relaxed) == 0)
    room.first_write_ns.store(SteadyNs(), std::memory_order_relaxed);
  for (auto& [rank, post] : posts) {
    // Counted before anything can complete: completions need mu_.
    SenderFlow& flow = room.flows.at(rank);
    if (last)
      flow.final_note = NotifyMsg{room.room, flow.meta.generation, flow.next_chunk, true,
                                  static_cast<uint32_t>(room.num_pages - room.pages_sent)};
    ++flow.next_chunk;
    ++flow.inflight;
    ++room.inflight;
    if (flow.unrevocable) ++unrevocable_chunks_;
    out.posts.push_back(std::move(post));
  }
  room.pages_sent += n;
  room.last_posted = last;
  room.phase = Phase::kTransferring;
  room.phase_since = Now();
  ++chunks_sent_;
  UpdateSenderStateLocked(room);
}

void ManagerImpl::SenderAbort(const std::shared_ptr<SenderRoom>& room, FailureCause cause,
                              std::string detail, const char* mechanism) {
  Outbox out;
  {
    MutexLock lock(mu_);
    FailSenderLocked(*room, MakeRecord(Self(), cause, std::move(detail), room->phase, mechanism),
                     out);
  }
  Flush(out);
}

void ManagerImpl::OnChunkDone(const std::shared_ptr<SenderRoom>& sp, int decode_rank,
                              const Status& s, uint64_t bytes, uint64_t ops) {
  Outbox out;
  {
    MutexLock lock(mu_);
    SenderRoom& room = *sp;
    bytes_written_ += bytes;
    write_ops_ += ops;
    if (metrics_) metrics_->Wrote(bytes, ops);
    auto it = room.flows.find(decode_rank);
    if (it == room.flows.end()) return;
    SenderFlow& flow = it->second;
    --flow.inflight;
    --room.inflight;
    KeepReleasedWritingLocked(sp);
    if (flow.unrevocable) --unrevocable_chunks_;
    room.phase_since = Now();
    if (s.ok()) {
      // Decode acknowledged these writes: on a lossy link its heartbeats may
      // wait for a retransmit on their own connection while the data
      // connection still carries its word.
      Peer* peer = FindPeerLocked(flow.peer_key);
      if (peer != nullptr && peer->acks_prove_life && !peer->failed) {
        peer->last_heard = room.phase_since;
        peer->last_heard_wall = WallNow();
      }
    }
    if (!s.ok() && !room.failure) {
      Peer* peer = FindPeerLocked(flow.peer_key);
      FailureRecord r;
      if (peer != nullptr && peer->failed && peer->failure) {
        r = *peer->failure;
      } else {
        auto [cause, detail] = TransportErrorCause(flow.decode, s);
        r = MakeRecord(flow.decode, cause, std::move(detail), Phase::kTransferring,
                       "transport error");
      }
      r.room = room.room;
      r.generation = flow.meta.generation;
      FailSenderLocked(room, r, out);
    }
    DrainFlowLocked(room, flow, out);
    SendFinalNoteLocked(room, flow, out);
    UpdateSenderStateLocked(room);
  }
  Flush(out);
}

void ManagerImpl::FailSenderLocked(SenderRoom& room, FailureRecord record, Outbox& out) {
  if (!MarkRoomFailedLocked(room, record)) return;
  for (auto& [rank, flow] : room.flows) {
    if (flow.told || flow.closed) continue;
    flow.told = true;
    Peer* peer = FindPeerLocked(flow.peer_key);
    if (peer == nullptr || peer->failed) continue;
    FailureRecord r = record;
    r.generation = flow.meta.generation;
    // With writes in flight the notice must not queue behind them.
    Send(out, *peer, RoomFailedMsg{room.room, flow.meta.generation, flow.inflight == 0, r},
         flow.inflight > 0 ? Lane::kUrgent : Lane::kOrdered);
    if (flow.inflight > 0) {
      flow.quiesce_reply = true;
    } else {
      flow.closed = true;
    }
  }
}

void ManagerImpl::UpdateSenderStateLocked(SenderRoom& room) {
  if (room.failure) return;
  bool all_meta = room.cp_dummy || room.decode_tp_size > 0;
  for (int d : room.expected_decode) all_meta = all_meta && room.flows.count(d) > 0;
  KVPoll next;
  if (!all_meta) {
    next = KVPoll::kBootstrapping;
  } else if (room.last_posted && room.inflight == 0 && room.restart_check == 0) {
    next = KVPoll::kSuccess;  // never before its restart check passed it
  } else if ((room.pages_sent == 0 || room.cp_dummy) && !room.last_posted) {
    next = KVPoll::kWaitingForInput;
  } else {
    next = KVPoll::kTransferring;
  }
  KVPoll prev = room.poll();
  if (next == prev) return;
  if (next != KVPoll::kBootstrapping && room.metadata_done_ns.load(std::memory_order_relaxed) == 0)
    room.metadata_done_ns.store(SteadyNs(), std::memory_order_relaxed);
  if (next == KVPoll::kWaitingForInput) {
    room.phase = Phase::kWaitingForInput;
    room.phase_since = Now();
  }
  if (next == KVPoll::kSuccess) {
    room.writes_done_ns.store(SteadyNs(), std::memory_order_relaxed);
    room.phase = Phase::kDone;
    ++succeeded_;
    if (metrics_)
      metrics_->Finished(true, std::chrono::duration<double>(Now() - room.created).count());
  }
  changes_.Set(room, next);
}

void ManagerImpl::OnMeta(const RankId& from, MetaMsg meta, Outbox& out) {
  if (opts_.role != Role::kPrefill || from.role != Role::kDecode) return;
  Peer* peer = PeerFromLocked(from);
  if (peer == nullptr || peer->failed) {
    KVB_LOG_WARN("metadata for room {} from unknown or failed {} dropped", meta.room,
                 from.ToString());
    return;
  }
  if (meta.decode_tp_size != peer->tp_size) {
    // Flows are planned from the tp size; one its Hello did not declare
    // would wait for decode ranks that do not exist.
    ++invalid_dropped_;
    KVB_LOG_WARN(
        "dropping metadata for room {} from {}: decode tp size {} is not the {} of its "
        "handshake",
        meta.room, from.ToString(), meta.decode_tp_size, peer->tp_size);
    return;
  }
  auto it = senders_.find(meta.room);
  if (it != senders_.end() && it->second->live) {
    AdoptMetaLocked(*it->second, from, std::move(meta), out);
    return;
  }
  const uint64_t room = meta.room;
  const uint64_t generation = meta.generation;
  SenderInbox::MetaVerdict v = inbox_.OnMetaWithoutSender(std::move(meta), from, Now());
  if (v.kind == SenderInbox::MetaVerdict::kHeld) return;
  if (v.kind == SenderInbox::MetaVerdict::kOverLimit) {
    // Bounded: this request fails now, with what to change, and decode
    // frees its pages; the held ones are kept.
    v.record = MakeRecord(Self(), FailureCause::kInvalidRequest,
                          PendingLimitDetail(inbox_, opts_.max_pending_requests),
                          Phase::kWaitingForMetadata, "pending metadata limit");
    v.record.generation = generation;
  }
  Send(out, *peer, RoomFailedMsg{room, generation, true, std::move(v.record)});
}

// Held for the room's next sender, within the inbox's bounds; past them
// that request fails now, as metadata without a sender does.
void ManagerImpl::HoldForNextSenderLocked(MetaMsg meta, Peer& peer, Outbox& out) {
  const uint64_t room = meta.room, generation = meta.generation;
  if (inbox_.HoldForNextSender(std::move(meta), peer.id, Now())) return;
  FailureRecord r = MakeRecord(Self(), FailureCause::kInvalidRequest,
                               PendingLimitDetail(inbox_, opts_.max_pending_requests),
                               Phase::kWaitingForMetadata, "pending metadata limit");
  r.generation = generation;
  Send(out, peer, RoomFailedMsg{room, generation, true, std::move(r)});
}

void ManagerImpl::AdoptMetaLocked(SenderRoom& room, const RankId& from, MetaMsg meta, Outbox& out) {
  Peer* peer = PeerFromLocked(from);
  if (peer == nullptr || peer->failed) return;
  if (!OfRoomDecodeGroup(room, from)) {
    if (room.failure || room.poll() == KVPoll::kSuccess) {
      // A next use of the room id, by another group: for the next sender.
      HoldForNextSenderLocked(std::move(meta), *peer, out);
      return;
    }
    // The room id of a request another decode instance or dp reads here,
    // still under way: that rank's request is refused, this one goes on
    // unchanged.
    ++invalid_dropped_;
    const RankId& group = room.flows.begin()->second.decode;
    FailureRecord r = MakeRecord(
        Self(), FailureCause::kInvalidRequest,
        fmt::format("room {} is already a request of {} dp{} under way on this rank; a "
                    "room id is one request at a time across decode instances and dp ranks",
                    room.room, group.instance.empty() ? "decode" : "decode[" + group.instance + "]",
                    group.dp),
        Phase::kWaitingForMetadata, "metadata check");
    r.generation = meta.generation;
    Send(out, *peer, RoomFailedMsg{room.room, meta.generation, true, std::move(r)});
    return;
  }
  auto existing = room.flows.find(from.tp);
  if (existing != room.flows.end()) {
    if (existing->second.meta.generation != meta.generation) {
      // A newer use of the room by decode: keep it for the next sender.
      HoldForNextSenderLocked(std::move(meta), *peer, out);
    }
    return;
  }
  if (RefuseMetaLocked(room, from, *peer, meta, out)) return;
  SenderFlow flow;
  flow.peer_key = peer->key;
  flow.decode = from;
  // Decode's grant lets a same-host peer map its pages unless both sides
  // are told otherwise (ManagerOptions::grant_same_host_peers).
  flow.unrevocable = WritesByMapping(from);
  flow.meta = std::move(meta);
  Status bad = ShapeFlowLocked(room, from, flow);
  if (bad.ok() && flow.slice) bad = CheckFlowMeta(room, *peer, from, flow);
  const uint64_t gen = flow.meta.generation;
  room.flows.emplace(from.tp, std::move(flow));
  if (!bad.ok()) {
    FailureRecord r = MakeRecord(from, FailureCause::kInvalidRequest, bad.message(), room.phase,
                                 "metadata check");
    r.generation = gen;
    FailSenderLocked(room, r, out);
    return;
  }
  int64_t unset = -1;  // the first decode rank's; another that differs fails at Init
  room.decode_prefix_pages.compare_exchange_strong(unset, room.flows.at(from.tp).meta.prefix_pages);
  UpdateSenderStateLocked(room);
}

bool ManagerImpl::RefuseMetaLocked(SenderRoom& room, const RankId& from, Peer& peer,
                                   const MetaMsg& meta, Outbox& out) {
  // Decode failed this request before its metadata got here (the notice
  // overtook it): adopting it would write into pages decode took back.
  if (auto abort = inbox_.TakeAbortFor(meta.room, from.tp, meta.generation); abort && !room.failure)
    FailSenderLocked(room, *abort, out);
  // The request is from a decode instance with a dead rank: that rank's
  // metadata will never come. Unless the request awaits its restart check:
  // the record is the one the check reads the registry about (the rank may
  // have restarted, and its successor's metadata be on the way).
  if (!room.failure && room.restart_check == 0) {
    if (const FailureRecord* dead = DeadRankOfInstanceLocked(from))
      FailSenderLocked(room, *dead, out);
  }
  if (!room.failure) return false;
  // Tell decode at once why; nothing was or will be written.
  FailureRecord r = *room.failure;
  r.generation = meta.generation;
  Send(out, peer, RoomFailedMsg{room.room, meta.generation, true, r});
  return true;
}

Status ManagerImpl::ShapeFlowLocked(SenderRoom& room, const RankId& from, SenderFlow& flow) {
  // Whether state moves as slices is decided on decode's layout, as decode
  // decides it (StateSlicedFor).
  const Peer* peer = FindPeerLocked(flow.peer_key);
  const bool sliced = peer != nullptr && StateSlicedFor(peer->layout, layout_.tp_size);
  if (room.decode_tp_size == 0) {
    KVB_ASSIGN_OR_RETURN(std::vector<HeadSlice> flows,
                         ComputeFlows(layout_.tp_size, flow.meta.decode_tp_size,
                                      layout_.total_kv_heads, layout_.is_mla, sliced));
    room.decode_tp_size = flow.meta.decode_tp_size;
    for (const HeadSlice& s : FlowsFromPrefill(flows, self_.tp))
      if (std::find(room.expected_decode.begin(), room.expected_decode.end(), s.decode_rank) ==
          room.expected_decode.end())
        room.expected_decode.push_back(s.decode_rank);
    if (room.expected_decode.empty())
      room.expected_decode.push_back(self_.tp % room.decode_tp_size);
  } else if (flow.meta.decode_tp_size != room.decode_tp_size) {
    return InvalidArgumentError(fmt::format("decode tp size {} disagrees with {} seen earlier",
                                            flow.meta.decode_tp_size, room.decode_tp_size));
  }
  KVB_ASSIGN_OR_RETURN(std::vector<HeadSlice> flows,
                       ComputeFlows(layout_.tp_size, room.decode_tp_size, layout_.total_kv_heads,
                                    layout_.is_mla, sliced));
  for (const HeadSlice& s : FlowsFromPrefill(flows, self_.tp)) {
    if (s.decode_rank != from.tp) continue;
    flow.slice = s;
    // The lowest prefill rank feeding this decode rank also writes whole
    // state and, on the last stage that decode rank reads, aux.
    int lowest = s.prefill_rank;
    for (const HeadSlice& o : FlowsToDecode(flows, from.tp))
      lowest = std::min(lowest, o.prefill_rank);
    flow.carries_state = lowest == self_.tp && self_.cp == 0;
    flow.last_stage_read =
        peer != nullptr && LastStageRead(self_.pp, opts_.parallel.pp_size, peer->layout.pp_size);
    break;
  }
  if (std::find(room.expected_decode.begin(), room.expected_decode.end(), from.tp) ==
      room.expected_decode.end())
    return InvalidArgumentError(fmt::format(
        "metadata from decode tp{}, which prefill tp{} does not serve", from.tp, self_.tp));
  if (flow.meta.dummy == flow.slice.has_value())
    return InvalidArgumentError(
        fmt::format("decode tp{} and prefill tp{} disagree on whether this rank is a dummy",
                    from.tp, self_.tp));
  return Status();
}

Status ManagerImpl::CheckFlowMeta(const SenderRoom& room, const Peer& peer, const RankId& from,
                                  const SenderFlow& flow) const {
  KVB_RETURN_IF_ERROR(CheckPageIndices(peer.layout, flow.meta.pages, /*unique=*/true));
  if (!peer.layout.aux.empty() &&
      (flow.meta.aux_index < 0 || flow.meta.aux_index >= Rows(peer.layout.aux)))
    return InvalidArgumentError(fmt::format("decode aux index {} out of range [0, {})",
                                            flow.meta.aux_index, Rows(peer.layout.aux)));
  KVB_RETURN_IF_ERROR(CheckStateSlots("decode state index", peer.layout.state,
                                      peer.layout.state_types, flow.meta.state));
  // Under dcp the prefix is whole virtual pages (decode checks it too): a
  // shifted one would move every token to another rank.
  const int dcp = peer.layout.dcp_size;
  if (dcp > 1 && flow.meta.prefix_pages % dcp != 0)
    return InvalidArgumentError(
        fmt::format("decode tp{}'s prefix of {} pages is not whole virtual pages of {} under dcp",
                    from.tp, flow.meta.prefix_pages, dcp));
  if (room.initialized) return CheckDestinationCount(from.tp, flow, room.num_pages, &peer.layout);
  return Status();
}

}  // namespace kvbridge::internal
