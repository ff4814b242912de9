// Prefill's side of a proven Hello (the acceptor thread, AcceptRound):
// what happens to a peer already at that position (KeepOldPeerLocked,
// hello_rule.h), the decode rank's regions mapped, the answer sent. Never
// on a transport thread: a same-host mapping fills its page tables (~0.07
// s/GiB), and a transport thread held that long silences the rank.
#include <fmt/format.h>

#include "common/log.h"
#include "connector/hello_rule.h"
#include "connector/manager_impl.h"

namespace kvbridge::internal {

void ManagerImpl::AcceptRound() {
  std::vector<PendingAccept> todo;
  {
    MutexLock lock(mu_);
    todo.swap(accepts_);
  }
  for (PendingAccept& a : todo) {
    if (stop_.load()) return;  // the manager closes: their endpoints close with it
    AcceptHello(std::move(a));
  }
}

// An acceptance waits in the queue and while the regions are mapped; what
// changed meanwhile outdates it: this rank rejoined (the proof named the old
// incarnation), or the transport reported its endpoint failed (no peer held
// it to fail, so it would be installed ready on a dead endpoint): the
// session is over, no answer. A process a record declared dead, before its
// proof or since, is not outdated but refused, with an answer
// (RefuseDeclaredFailedLocked): one rule, whenever the record came.
bool ManagerImpl::StaleAcceptLocked(const PendingAccept& a) const {
  if (a.own_incarnation != incarnation_.load()) return true;
  auto accepting = accepting_.find(a.tpeer);
  return accepting != accepting_.end() && accepting->second;
}

// The process `id` (its position and incarnation) was declared failed by a
// record this rank applied (or by its own detection).
bool ManagerImpl::DeclaredFailedLocked(const RankId& id) const {
  return applied_.count({PeerKey(id), id.incarnation}) > 0;
}

bool ManagerImpl::KeepOldPeerLocked(const RankId& from, const AuthTransport::Binding& b,
                                    Outbox& out, PeerId* fresh, PeerId* stale) {
  Peer* old = FindPeerLocked(PeerKey(from));
  OldPeerFacts facts;
  if (old != nullptr) {
    facts.exists = true;
    facts.same_incarnation = old->id->incarnation == from.incarnation;
    facts.ready = old->ready;
    facts.retired = old->retired;
    facts.failed = old->failed;
    facts.failure_notice =
        sglang_registry_ && old->failure && IsFailureNotice(*old->failure, from, Self());
    for (auto& [id, room] : senders_)
      for (auto& [rank, flow] : room->flows)
        facts.flows_use_it = facts.flows_use_it || flow.peer_key == old->key;
  }
  facts.declared_dead = DeclaredFailedLocked(from);
  const OldPeerFate fate = FateOfOldPeer(facts);
  switch (fate) {
    case OldPeerFate::kNone:
    case OldPeerFate::kStaysFailed:  // it learns so from the RankFailed it gets
      break;
    case OldPeerFate::kTakesNewSession: {
      // Cut off, its session closed at the failure (FailPeerWithRecordLocked):
      // it gets the new one, and nothing to write into (no region is imported).
      if (old->tpeer != 0) {  // closed at the failure, or the old session's
        by_tpeer_.erase(old->tpeer);
        out.disconnect.push_back(old->tpeer);
      }
      DropBeatLocked(*old, out);
      old->tpeer = std::exchange(*fresh, 0);
      by_tpeer_[old->tpeer] = old;
      auth_->Bind(old->tpeer, b);
      Send(out, *old, HelloAckMsg{StatusCode::kOk, "", transport_->Address(), ""});
      KVB_LOG_INFO("{}, which this rank failed, made a new handshake: answered, still failed",
                   from.ToString());
      break;
    }
    case OldPeerFate::kAnsweredAgain: {
      // It did not hear our answer: answer on our endpoint again, in the new
      // session (the only one it knows now).
      auth_->Bind(old->tpeer, b);
      Result<DataPath> path = transport_->PathTo(old->tpeer);
      Send(out, *old,
           HelloAckMsg{StatusCode::kOk, "", transport_->Address(),
                       std::string(path.ok() ? DataPathName(*path) : std::string_view())});
      break;
    }
    case OldPeerFate::kToldItFailed:
      RefuseDeclaredFailedLocked(from, b, *fresh, out);
      break;
    case OldPeerFate::kReplaced:
    case OldPeerFate::kReplacedRestarted:
      if (fate == OldPeerFate::kReplaced) {
        KVB_LOG_INFO("{} sent its Hello again; answering on a new endpoint", from.ToString());
      } else if (!old->failed) {
        FailPeerLocked(*old, FailureCause::kPeerExited, NewIncarnationDetail(old->id, from),
                       "new incarnation", out);
      }
      *stale = old->tpeer;
      by_tpeer_.erase(old->tpeer);
      DropBeatLocked(*old, out);
      peers_.erase(PeerKey(from));
      break;
  }
  return KeepsOldPeer(fate);
}

// Answered on its new session, which AcceptHello then closes; it learns the
// record from the registry (peers' word about it is not taken there),
// fences itself and comes back as a new incarnation.
void ManagerImpl::RefuseDeclaredFailedLocked(const RankId& from, const AuthTransport::Binding& b,
                                             PeerId fresh, Outbox& out) {
  FailureRecord why;
  auto it = dead_ranks_.find(PeerKey(from));
  if (it != dead_ranks_.end() && it->second.origin.incarnation == from.incarnation) {
    why = it->second;
  } else {
    // Applied as late news of a replaced process, or its record gave way to
    // its successor's acceptance: what this rank knows, said as a record.
    why = MakeRecord(from, FailureCause::kPeerExited,
                     "a failure record about this process was applied here and another "
                     "incarnation has taken its place",
                     Phase::kBootstrapping, "handshake");
  }
  auth_->Bind(fresh, b);
  // Urgent: on its way before AcceptHello closes the endpoint.
  out.urgent.emplace_back(
      fresh, EncodeMessage(Self(), HelloAckMsg{kRefusedAsDeclaredFailed,
                                               "a failure record declared this process failed: " +
                                                   why.Message(),
                                               transport_->Address(), ""}));
  // With sglang's server no registry keeps records: a failure this rank
  // detected is told here, as to a failed peer (the notice rule).
  if (sglang_registry_ && IsFailureNotice(why, from, Self()))
    out.urgent.emplace_back(fresh, EncodeMessage(Self(), RankFailedMsg{why}));
  KVB_LOG_WARN("{} said Hello, but a failure record declared that process failed: refused ({})",
               from.ToString(), why.Message());
}

namespace {

// Maps the regions `hello` grants into `peer` (its endpoint set).
Status ImportRegions(Transport& transport, const HelloMsg& hello, Peer& peer) {
  auto import = [&](const std::vector<std::string>& keys,
                    std::vector<RemoteRegionId>* ids) -> Status {
    for (const std::string& key : keys) {
      KVB_ASSIGN_OR_RETURN(RemoteRegionId id, transport.ImportRegion(peer.tpeer, key));
      ids->push_back(id);
    }
    return Status();
  };
  KVB_RETURN_IF_ERROR(import(hello.kv_keys, &peer.remote.kv));
  KVB_RETURN_IF_ERROR(import(hello.aux_keys, &peer.remote.aux));
  return import(hello.state_keys, &peer.remote.state);
}

// Decode rank `a.from` (at `key`) as its proven Hello describes it, on
// `a.tpeer`, last heard now.
std::unique_ptr<Peer> PeerOfHello(const PendingAccept& a, std::string key, SteadyTime now,
                                  WallTime wall_now) {
  auto peer = std::make_unique<Peer>();
  peer->last_heard = now;
  peer->last_heard_wall = wall_now;
  peer->key = std::move(key);
  peer->shared_key = SharedKey(peer->key);
  peer->id = Shared<RankId>(a.from);
  peer->address = a.hello.address;
  peer->layout = a.hello.layout;
  peer->tp_size = a.hello.tp_size;
  peer->tpeer = a.tpeer;
  return peer;
}

// One line per peer (the transport logs each region at debug level).
std::string ConnectedLine(const RankId& from, const std::string& path_name, const std::string& wire,
                          const Peer& peer) {
  return fmt::format("connected to {} via {}{}{}: mapped {} regions ({} kv, {} aux, {} state)",
                     from.ToString(), path_name.empty() ? std::string("?") : path_name,
                     wire.empty() ? "" : " over ", wire,
                     peer.remote.kv.size() + peer.remote.aux.size() + peer.remote.state.size(),
                     peer.remote.kv.size(), peer.remote.aux.size(), peer.remote.state.size());
}

}  // namespace

void ManagerImpl::AcceptHello(PendingAccept a) {
  // The acceptor thread (AcceptRound); in scripted tests the caller's.
  std::lock_guard<std::mutex> resolve(resolve_mu_);
  const RankId& from = a.from;
  PeerId tpeer = a.tpeer;
  Outbox out;
  PeerId stale = 0;
  bool keep_old = false, outdated = false;
  {
    MutexLock lock(mu_);
    outdated = StaleAcceptLocked(a);
    if (!outdated) keep_old = KeepOldPeerLocked(from, a.binding, out, &tpeer, &stale);
    if (outdated || keep_old) accepting_.erase(a.tpeer);  // an old peer may hold it now
  }
  Flush(out);
  if (outdated || keep_old) {
    if (tpeer != 0) transport_->Disconnect(tpeer);
    return;
  }
  if (stale != 0) transport_->Disconnect(stale);

  std::unique_ptr<Peer> peer = PeerOfHello(a, PeerKey(from), Now(), WallNow());
  auth_->Bind(tpeer, a.binding);
  Status verdict = CheckCompatible(layout_, a.hello.layout);
  if (verdict.ok()) verdict = ImportRegions(*transport_, a.hello, *peer);
  Result<DataPath> path = transport_->PathTo(tpeer);
  const std::string path_name(path.ok() ? DataPathName(*path) : std::string_view());
  // Over UCX the target acknowledges each batch from its own progress
  // thread: a completed write is word from decode (see OnChunkDone). On
  // the same-host paths a write completes here, whatever decode's state.
  peer->acks_prove_life = path.ok() && *path == DataPath::kUcxRendezvous;
  // kRefusedAsDeclaredFailed says only that (KeepOldPeerLocked).
  const StatusCode code =
      verdict.code() == kRefusedAsDeclaredFailed ? StatusCode::kFailedPrecondition : verdict.code();
  HelloAckMsg ack{code, verdict.message(), transport_->Address(), path_name};
  out.messages.emplace_back(tpeer, EncodeMessage(Self(), ack));
  const std::string connected = ConnectedLine(from, path_name, transport_->WireTo(tpeer), *peer);
  const std::string key = peer->key;
  const std::string address = peer->address;
  bool refused = false, installed = false;
  {
    MutexLock lock(mu_);
    // Either may have changed while the regions were mapped; both come
    // before the verdict on its layout and regions.
    outdated = StaleAcceptLocked(a);
    refused = !outdated && DeclaredFailedLocked(from);
    accepting_.erase(tpeer);
    if (outdated || refused) out.messages.clear();  // neither the acceptance nor the verdict
    if (refused) {
      RefuseDeclaredFailedLocked(from, a.binding, tpeer, out);
    } else if (!outdated && verdict.ok()) {
      dead_ranks_.erase(peer->key);
      peer->ready = true;
      by_tpeer_[tpeer] = peer.get();
      peers_[peer->key] = std::move(peer);
      installed = true;
    }
  }
  if (!installed) {  // outdated: no answer, the session it proved is over
    if (!outdated && !refused) KVB_LOG_WARN("refusing {}: {}", from.ToString(), verdict.ToString());
    Flush(out);
    transport_->Disconnect(tpeer);
    return;
  }
  KVB_LOG_INFO("{}", connected);
  // The ack leaves before the heartbeat endpoint is opened: across hosts
  // that connect waits for TCP's handshake, a lost SYN costs 1 s, and an
  // ack held behind it came after decode had given up on its Hello.
  Flush(out);
  // The heartbeat endpoint (Peer::beat) opens now, not later on the
  // resolver thread, where it waited behind the first requests' writes
  // (0.6 s in `kvbridge demo --hosts 2`), and so did the heartbeats.
  OpenBeat(key, address, tpeer);
}

}  // namespace kvbridge::internal
