// Peers and liveness: transport failures, silent peers, the ticker's
// heartbeats and deadlines, the fence thread's revokes, and the resolver
// thread that does the ticker's and Init's network waits for them.
#include <fmt/format.h>

#include "common/log.h"
#include "common/process.h"
#include "connector/liveness_rule.h"
#include "connector/manager_impl.h"
#include "connector/record_tag.h"

namespace kvbridge::internal {

void ManagerImpl::OnPeerFailure(PeerId tpeer, const Status& why) {
  Outbox out;
  {
    MutexLock lock(mu_);
    auto it = by_tpeer_.find(tpeer);
    if (it == by_tpeer_.end()) {
      NoPeersEndpointFailedLocked(tpeer, why, out);
    } else if (!it->second->failed) {
      Peer& peer = *it->second;
      auto [cause, detail] = TransportErrorCause(peer.id, why);
      FailPeerLocked(peer, cause, std::move(detail), "transport error", out);
    }
  }
  Flush(out);
}

// A Hello's endpoint that no peer holds yet failed. Challenged and not yet
// proven: the endpoint is let go (its proof, if it comes, connects anew).
// Proven: its acceptance is dropped (StaleAcceptLocked). Either way no peer
// is made on it.
void ManagerImpl::NoPeersEndpointFailedLocked(PeerId tpeer, const Status& why, Outbox& out) {
  auto accepting = accepting_.find(tpeer);
  if (accepting != accepting_.end()) {
    if (!std::exchange(accepting->second, true))
      KVB_LOG_INFO("the endpoint of a Hello being accepted failed ({}): not accepted",
                   why.ToString());
    return;
  }
  if (std::optional<RankId> from = challenges_.Forget(tpeer)) {
    KVB_LOG_INFO("the endpoint of {}'s Hello failed before its proof ({}): let go",
                 from->ToString(), why.ToString());
    out.disconnect.push_back(tpeer);
  }
}

std::pair<FailureCause, std::string> ManagerImpl::TransportErrorCause(const RankId& peer,
                                                                      const Status& why) const {
  if (LocalProcessState(peer) == ProcessState::kExited)
    return {FailureCause::kPeerExited, "process exited"};
  return {FailureCause::kPeerUnreachable, why.message()};
}

bool ManagerImpl::OnThisHost(const RankId& id) const {
  return SameHost(HostOf(id), HostOf(self_)) && !liveness_as_remote_;
}

bool ManagerImpl::WritesByMapping(const RankId& id) const {
  return OnThisHost(id) && !opts_.grant_same_host_peers;
}

ProcessState ManagerImpl::LocalProcessState(const RankId& id) const {
  if (!OnThisHost(id)) return ProcessState::kUnknown;
  return hooks_.process_state ? hooks_.process_state(id.pid) : GetProcessState(id.pid);
}

void ManagerImpl::FailSilentPeerLocked(Peer& peer, ProcessState ps, const std::string& silence,
                                       const char* mechanism, Outbox& out) {
  if (ps == ProcessState::kExited) {
    FailPeerLocked(peer, FailureCause::kPeerExited, "process exited", mechanism, out);
    return;
  }
  if (ps == ProcessState::kUnknown && !OnThisHost(peer.id)) {
    FailPeerLocked(peer, FailureCause::kPeerUnreachable, RemoteSilence(peer.id, silence), mechanism,
                   out);
    return;
  }
  const std::string what = ps == ProcessState::kStopped ? DescribeProcessState(ps) + ", " : "";
  FailPeerLocked(peer, FailureCause::kPeerUnresponsive, what + silence, mechanism, out);
}

// A silent rank on another host: no /proc to look at, so a partition, a
// host that went down and a stopped process look the same from here.
std::string ManagerImpl::RemoteSilence(const RankId& id, const std::string& silence) const {
  std::string where = fmt::format("on host {} (this rank is on {})", id.host, self_.host);
  if (id.host == self_.host && id.boot_id != self_.boot_id) {
    where = id.boot_id.empty() || self_.boot_id.empty()
                ? fmt::format("on host {}, whose boot id is not known here", id.host)
            : KernelBootId(id.boot_id) == KernelBootId(self_.boot_id) &&
                    id.boot_id.find('/') != std::string::npos &&
                    self_.boot_id.find('/') != std::string::npos
                ? fmt::format(
                      "on host {} in another PID namespace ('{}'; this rank's is '{}': "
                      "a container of the same machine)",
                      id.host, id.boot_id, self_.boot_id)
                : fmt::format(
                      "on host {} with boot id '{}' (this rank's is '{}': another machine "
                      "of the same name)",
                      id.host, id.boot_id, self_.boot_id);
  }
  return fmt::format(
      "{} {}: partitioned, down or stopped; another host's process state cannot be read from "
      "here",
      silence, where);
}

void ManagerImpl::FailPeerLocked(Peer& peer, FailureCause cause, std::string detail,
                                 std::string mechanism, Outbox& out) {
  FailureRecord base =
      MakeRecord(peer.id, cause, std::move(detail), Phase::kTransferring, std::move(mechanism));
  base.last_sign_of_life = peer.last_heard_wall;
  FailPeerWithRecordLocked(peer, base, out);
  if (cause != FailureCause::kLayoutMismatch) PublishLocked(base);
}

void ManagerImpl::FailPeerWithRecordLocked(Peer& peer, const FailureRecord& base, Outbox& out) {
  peer.failed = true;
  peer.failure = base;
  peer.held.clear();
  // A peer on another host that went silent may be alive behind a
  // partition, its writes queued in the network: closing the connection
  // means none of them lands after the partition heals (its rooms fail
  // here and their pages are reused at once: write_rule.h, kConnectionClosed).
  if (base.cause == FailureCause::kPeerUnreachable && !OnThisHost(peer.id) && peer.tpeer != 0) {
    out.disconnect.push_back(peer.tpeer);
    DropBeatLocked(peer, out);
  }
  if (base.cause != FailureCause::kLayoutMismatch) {
    dead_ranks_[peer.key] = base;
    applied_.insert({peer.key, peer.id->incarnation});
  }
  recent_rank_failure_ = base;
  KVB_LOG_WARN("peer failed: {}", base.Message());
  for (auto& [id, room] : senders_) {
    bool touches = false;
    for (auto& [rank, flow] : room->flows) {
      if (flow.peer_key != peer.key) continue;
      touches = true;
      flow.closed = true;  // nothing more can be said to a dead peer
    }
    if (!touches || room->failure) continue;
    FailureRecord r = base;
    r.room = room->room;
    r.phase = room->phase;
    FailSenderLocked(*room, r, out);
  }
  // Its grant is revoked on the fence thread (FenceRound), which then
  // counts its sources quiesced.
  if (peer.grant != 0 && !peer.fenced) fence_pending_.insert(peer.key);
  for (auto& [id, room] : receivers_) {
    bool touches = false;
    for (ReceiverSource& src : room->sources) {
      if (src.peer_key != peer.key) continue;
      touches = true;
      SettleSourceLocked(*room, src, &peer);
    }
    if (!touches) continue;
    if (!room->failure) {
      FailureRecord r = base;
      r.room = room->room;
      r.generation = room->generation;
      r.phase = room->phase;
      FailReceiverLocked(*room, r, out);
    }
    UpdateQuiescedLocked(*room);
  }
  inbox_.DropMetaIf([&](const RankId& from) { return PeerKey(from) == peer.key; });
}

// A peer this rank failed that speaks again (it was stopped, or cut off
// without its endpoint closing, and lives on) is told so, once a heartbeat
// interval at most, with the record this rank made, when the registry is
// sglang's server: nothing there tells it it was fenced, so without this
// word the pair stays apart until one is restarted; told, it rejoins as a
// new incarnation (rejoin.cc). kvbridge's registry and etcd tell it
// themselves. Only the detector says it (Admit checks the same).
void ManagerImpl::TellFailedPeerLocked(Peer& peer, Outbox& out) {
  if (!sglang_registry_ || fatal_ || !peer.failed || !peer.failure || peer.tpeer == 0 ||
      !peer.acked)
    return;
  const FailureRecord& r = *peer.failure;
  if (!IsFailureNotice(r, peer.id, Self())) return;
  const SteadyTime now = Now();
  if (peer.told_failed_at != SteadyTime{} && now - peer.told_failed_at < opts_.heartbeat_interval)
    return;
  if (peer.told_failed_at == SteadyTime{})
    KVB_LOG_INFO("{} speaks again after this rank failed it: telling it so", peer.id->ToString());
  peer.told_failed_at = now;
  Send(out, peer, RankFailedMsg{r}, Lane::kUrgent);
}

SourceWriteFacts ManagerImpl::WriteFactsLocked(const ReceiverRoom& room, const ReceiverSource& src,
                                               const Peer* peer) const {
  SourceWriteFacts f;
  f.dummy = src.dummy;
  f.request_done = room.phase == Phase::kDone;
  f.pages_sent = src.meta_sent;
  f.said_quiesced = src.said_quiesced;
  f.peer_known = peer != nullptr;
  if (peer == nullptr) return f;
  f.peer_failed = peer->failed;
  f.acked = peer->acked;
  f.rejoined = peer->rejoined;
  // Failed with no record: taken as exited.
  f.cause = peer->failure ? peer->failure->cause : FailureCause::kPeerExited;
  f.grant_revoked = peer->fenced;
  f.maps_pages = peer->mapping;
  f.has_grant = peer->grant != 0;
  f.on_this_host = OnThisHost(peer->id);
  return f;
}

bool ManagerImpl::SettleSourceLocked(const ReceiverRoom& room, ReceiverSource& src,
                                     const Peer* peer) {
  if (!src.quiesced && NoMoreWrites(WriteFactsLocked(room, src, peer)) != WriteEnd::kMayStillWrite)
    src.quiesced = true;
  return src.quiesced;
}

bool ManagerImpl::CutOffLocked(const Peer& peer) const {
  return peer.failed && peer.failure && peer.failure->cause == FailureCause::kPeerUnreachable &&
         !OnThisHost(peer.id);
}

void ManagerImpl::FenceRound() {
  std::vector<RetiredGrant> todo;  // incarnation 0: the peer now at `key`
  {
    MutexLock lock(mu_);
    for (const std::string& key : fence_pending_) {
      Peer* p = FindPeerLocked(key);
      if (p != nullptr && p->failed && p->grant != 0 && !p->fenced)
        todo.push_back({key, 0, p->grant, p->mapping});
    }
    fence_pending_.clear();
    for (RetiredGrant& r : retired_grants_) todo.push_back(std::move(r));
    retired_grants_.clear();
  }
  for (const RetiredGrant& t : todo) {
    Status st = transport_->RevokeGrant(t.grant);
    MutexLock lock(mu_);
    Peer* p = FindPeerLocked(t.key);
    const bool current = t.incarnation == 0;
    if (current && (p == nullptr || p->grant != t.grant)) continue;
    if (!st.ok()) {
      // Its writes may still land: the rooms stay unquiesced; next round.
      KVB_LOG_WARN("fencing {} not done yet: {}", t.key, st.ToString());
      if (current) {
        fence_pending_.insert(t.key);
      } else {
        retired_grants_.push_back(t);
      }
      continue;
    }
    if (current) p->fenced = true;
    const std::string which =
        current ? "" : fmt::format(" (incarnation {:#x}, replaced)", t.incarnation);
    if (t.mapping) {
      // What it mapped before stays mapped: its rooms keep waiting for its
      // Quiesced, its exit or its rejoin.
      KVB_LOG_INFO("revoked the write grant of {}{}: no new mapping of this rank's pages", t.key,
                   which);
      continue;
    }
    KVB_LOG_INFO("fenced {}{}: its write grant is revoked, nothing it sends lands", t.key, which);
    // Only the sources whose pages went under this grant (its session): an
    // older session at the position, of an older incarnation or of this one
    // met again, writes under its own grant, whose revoke may still be
    // waiting (retired_grants_).
    const uint64_t session = current ? p->session : t.session;
    for (auto& [id, room] : receivers_) {
      bool touches = false;
      for (ReceiverSource& src : room->sources) {
        if (src.peer_key != t.key || src.session != session) continue;
        touches = true;
        // Of the incarnation whose grant is now revoked, whichever peer
        // holds the position now.
        SourceWriteFacts f = WriteFactsLocked(*room, src, nullptr);
        f.peer_known = f.peer_failed = f.acked = f.has_grant = f.grant_revoked = true;
        if (NoMoreWrites(f) != WriteEnd::kMayStillWrite) src.quiesced = true;
      }
      if (touches) UpdateQuiescedLocked(*room);
    }
  }
}

void ManagerImpl::EveryHeartbeat(const char* name, const std::function<void()>& round, bool* wake) {
  NameThisThread(name);
  std::unique_lock<std::mutex> lock(ticker_mu_);
  while (!stop_) {
    ticker_cv_.wait_for(lock, opts_.heartbeat_interval,
                        [&] { return stop_ || (wake != nullptr && *wake); });
    if (stop_) return;
    if (wake != nullptr) *wake = false;
    lock.unlock();
    round();
    lock.lock();
  }
}

void ManagerImpl::ResolveRound() {
  std::set<std::string> retry_hello;
  {
    MutexLock state(mu_);
    retry_hello.swap(hello_retries_);
  }
  for (const std::string& key : retry_hello) RetryHello(key);
  if (opts_.role == Role::kDecode) RetryUnresolved();
  if (opts_.role == Role::kDecode && sglang_registry_) MeetPrefillAgain();
  OpenBeatEndpoints();
}

// Decode, with sglang's server, which tells no rank it was fenced and lists
// no decode rank. Two kinds of prefill peer are met again here:
// - those retired when this rank rejoined (rejoin.cc): each holds the old
//   incarnation failed and fails this instance's new requests
//   (NewRoomBlockerLocked) until a handshake shows it the new one. Only
//   peers healthy until the rejoin or cut off on another host (rejoin.cc),
//   kReconnectTries times, once a silence limit.
// - one this rank failed as unreachable on another host: its session was
//   closed then, so nothing it says reaches this rank, nothing tells it it
//   was fenced, and the pair would stay apart until one restarted. Once its
//   rank endpoint answers again at the same incarnation (the lookup reaches
//   its host), a handshake is made only to tell it (Peer::notice): it
//   fences itself and rejoins as a new incarnation, which a later lookup
//   finds. Backing off while its host stays out of reach (Peer::remeet).
void ManagerImpl::MeetPrefillAgain() {
  const auto limit = opts_.heartbeat_interval * opts_.heartbeat_misses;
  auto cut_off = [this](const Peer& p) KVB_REQUIRES(mu_) {
    return !p.retired && p.remeet.count < Peer::kMaxRemeets && CutOffLocked(p) &&
           IsFailureNotice(*p.failure, p.id, Self());
  };
  std::vector<std::pair<RankId, std::optional<FailureRecord>>> todo;  // notice: cut off
  {
    MutexLock lock(mu_);
    if (fatal_) return;
    const SteadyTime now = Now();
    for (auto& [key, peer] : peers_) {
      if (peer->id->role != Role::kPrefill) continue;
      if (peer->retired && peer->reconnect_tries > 0 && now - peer->witness_lookup_at >= limit) {
        peer->witness_lookup_at = now;
        --peer->reconnect_tries;
        todo.emplace_back(peer->id, std::nullopt);
      } else if (cut_off(*peer) && now >= peer->remeet.at) {
        const bool first = peer->remeet.at == SteadyTime{};  // not in the round it failed
        peer->remeet.at = now + limit * peer->remeet.waits;
        peer->remeet.waits = std::min(peer->remeet.waits * 2, Peer::kMaxRemeetWaits);
        if (!first) todo.emplace_back(peer->id, peer->failure);
      }
    }
  }
  std::set<std::string> unreached;  // hosts: one lookup that waits each round
  for (const auto& [id, notice] : todo) {
    // Its host first, without the resolver lock: behind a partition this
    // lookup of its rank endpoint waits for the client's timeout.
    if (notice && (unreached.count(id.host) > 0 ||
                   !LookUpTaggedRank(*registry_, *handshake_, id.dp, id.cp, id.tp, id.pp).ok())) {
      unreached.insert(id.host);
      continue;
    }
    // As ResolveSources: one lookup and install at a time, and only while
    // the peer is still the one chosen (a request may have met it since).
    std::lock_guard<std::mutex> resolve(resolve_mu_);
    {
      MutexLock lock(mu_);
      Peer* p = FindPeerLocked(PeerKey(id));
      if (p == nullptr || p->id->incarnation != id.incarnation ||
          !(notice ? cut_off(*p) : p->retired))
        continue;
    }
    RankId registered;
    Result<std::string> key = EnsurePrefillPeer(id, &registered, notice ? &*notice : nullptr);
    if (!key.ok())
      KVB_LOG_INFO("meeting {} again ({}): {}", id.ShortName(),
                   notice ? "to tell it this rank failed it" : "after this rank rejoined",
                   key.status().ToString());
  }
}

void ManagerImpl::OpenBeatEndpoints() {
  std::vector<std::pair<std::string, PeerId>> wanted;  // key, tpeer
  std::map<std::string, std::string> addresses;
  {
    MutexLock lock(mu_);
    for (auto& [key, peer] : peers_) {
      if (peer->beat != 0 || peer->tpeer == 0 || !peer->ready || !peer->acked || peer->failed ||
          peer->address.empty())
        continue;
      wanted.emplace_back(key, peer->tpeer);
      addresses[key] = peer->address;
    }
  }
  for (const auto& [key, tpeer] : wanted) OpenBeat(key, addresses[key], tpeer);
}

void ManagerImpl::OpenBeat(const std::string& key, const std::string& address, PeerId tpeer) {
  bool over_network = false;
  {
    MutexLock lock(mu_);
    Peer* p = FindPeerLocked(key);
    over_network = p != nullptr && p->over_network;
  }
  Result<PeerId> conn =
      over_network ? transport_->ConnectOverNetwork(address) : transport_->Connect(address);
  if (!conn.ok()) {
    KVB_LOG_DEBUG("heartbeat endpoint to {} not opened: {}", key, conn.status().ToString());
    return;  // heartbeats go over tpeer meanwhile; tried again next round
  }
  // Sealed under the peer's session before any heartbeat can use it.
  auth_->Share(*conn, tpeer);
  bool taken = false;
  {
    MutexLock lock(mu_);
    Peer* p = FindPeerLocked(key);
    if (p != nullptr && p->tpeer == tpeer && p->beat == 0 && !p->failed) {
      p->beat = *conn;
      by_tpeer_[p->beat] = p;
      taken = true;
    }
  }
  if (!taken) transport_->Disconnect(*conn);  // the peer changed meanwhile
}

void ManagerImpl::DropBeatLocked(Peer& peer, Outbox& out) {
  if (peer.beat == 0) return;
  by_tpeer_.erase(peer.beat);
  out.disconnect.push_back(std::exchange(peer.beat, 0));
}

void ManagerImpl::Tick() {
  const SteadyTime now = Now();
  const auto silence_limit = opts_.heartbeat_interval * opts_.heartbeat_misses;
  std::vector<PeerId> beats;
  Outbox out;
  // This rank's transport thread in one step (a handler, UCX progress) for
  // half the limit or more has heard no beat meanwhile: the peers' silence
  // is this rank's (WarnStuckDelivery says so), as when the ticker ran late.
  // For a handshake budget at most: a thread stuck longer is deadlocked,
  // and this rank's requests must not hang on it.
  std::optional<StepWatch::Busy> stuck = transport_->DeliveryBusy();
  if (stuck && stuck->for_us < silence_limit / 2) stuck.reset();
  const bool deaf = stuck && stuck->for_us < silence_limit * Peer::kHandshakeBudget;
  {
    MutexLock lock(mu_);
    const bool late = now - last_tick_ > silence_limit;
    if (late) {
      // This process was stopped or starved, not its peers.
      KVB_LOG_WARN("ticker ran {:.2f} s late; not blaming peers for it",
                   std::chrono::duration<double>(now - last_tick_).count());
    }
    // Their silence is counted afresh, but for a process /proc says exited.
    if (late || deaf)
      for (auto& [key, peer] : peers_)
        if (late || LocalProcessState(peer->id) != ProcessState::kExited) peer->last_heard = now;
    last_tick_ = now;
    for (auto& [key, peer] : peers_) {
      const LivenessVerdict v =
          JudgeLiveness(*peer, now, silence_limit, fatal_.has_value(),
                        [this, id = peer->id] { return LocalProcessState(id); });
      // Each beat goes on both endpoints, which are separate connections:
      // across hosts a lost segment stalls one TCP stream for its
      // retransmission timeout (0.2, 0.4, 0.8 s...), and two streams seldom
      // stall at once (5% loss with 20 ms delay failed healthy peers at a
      // 1 s limit when beats had one stream). Either arrival is life.
      if (v.beat) {
        beats.push_back(peer->tpeer);
        if (peer->beat != 0) beats.push_back(peer->beat);
      }
      if (v.kind == LivenessVerdict::Kind::kRetryHello) hello_retries_.insert(key);  // resolver
      if (v.kind == LivenessVerdict::Kind::kBlame)
        FailSilentPeerLocked(*peer, v.process, v.silence, v.mechanism, out);
    }
    TickSendersLocked(now, out);
    TickReceiversLocked(now, out);
    for (PeerId p : challenges_.Due(now)) out.disconnect.push_back(p);  // challenges let go
  }
  Flush(out);
  std::string beat = EncodeMessage(Self(), HeartbeatMsg{heartbeat_seq_.fetch_add(1)});
  for (PeerId p : beats) transport_->SendUrgentMessage(p, beat).IgnoreError();
  WarnStuckDelivery(stuck);
}

void ManagerImpl::WarnStuckDelivery(const std::optional<StepWatch::Busy>& busy) {
  // Half the limit (Tick): said before the peers blame this rank, once per step.
  if (!busy || busy->step == stuck_step_logged_) return;
  stuck_step_logged_ = busy->step;
  KVB_LOG_WARN(
      "this rank's transport thread has been in {} for {:.2f} s: no message or failure reaches "
      "this rank until it returns (it blames no peer for silence meanwhile), and its peers will "
      "take it for silent; get a stack of this process (py-spy dump --native, gdb -p {}) to see "
      "where it waits",
      busy->what, std::chrono::duration<double>(busy->for_us).count(), self_.pid);
}

}  // namespace kvbridge::internal
