// Rejoin: a rank the others declared failed (it was cut off or stopped, and
// lived on) comes back as a new incarnation of the same process once it
// reaches the registry again (docs/protocol.md, "Rejoining after a
// partition").
//
// What keeps the old incarnation's writes out: every room of it failed when
// the record was read (ApplyRankFailureLocked); the peers it had are retired
// here, their endpoints closed and, on decode, the write grant each was
// given revoked before the fence lifts; the survivors revoked the grants
// they gave it when they failed it (FenceRound). The new incarnation meets
// every peer through a new handshake: new session keys and, on decode, a new
// grant. The survivors see it as a restarted rank: its Hello names a new
// incarnation, the registry lists it at the position, and the failure record
// (kept in the registry for operators) goes on naming only the old one.
#include <fmt/format.h>

#include "common/log.h"
#include "connector/manager_impl.h"
#include "connector/rank_failure_rule.h"

namespace kvbridge::internal {

bool ManagerImpl::RetirePeersLocked(const FailureRecord& why, Outbox& out) {
  bool all_fenced = true;
  for (auto& [key, peer] : peers_) {
    if (!peer->retired) {
      peer->retired = true;
      // Healthy until this rank's own fence, or cut off on another host (it
      // may live on, holding this incarnation failed): met again after the
      // rejoin (MeetPrefillAgain). One that exited is not chased.
      if (!peer->failed || CutOffLocked(*peer)) peer->reconnect_tries = Peer::kReconnectTries;
      if (!peer->failed) {
        peer->failed = true;
        peer->failure = why;
      }
      peer->held.clear();
      DropBeatLocked(*peer, out);
      if (peer->tpeer != 0) {
        by_tpeer_.erase(peer->tpeer);
        out.disconnect.push_back(std::exchange(peer->tpeer, 0));
      }
      if (peer->grant != 0 && !peer->fenced) fence_pending_.insert(key);
    }
    if (peer->grant != 0 && !peer->fenced) all_fenced = false;
  }
  // Handshakes and metadata of the old sessions (none comes for the new
  // incarnation before it is registered).
  for (PeerId tpeer : challenges_.Clear()) out.disconnect.push_back(tpeer);
  for (const PendingAccept& a : accepts_) {  // proven, not taken
    out.disconnect.push_back(a.tpeer);
    accepting_.erase(a.tpeer);
  }
  accepts_.clear();
  hello_retries_.clear();
  inbox_.DropAllMeta();
  return all_fenced;
}

// sglang's server would file a decode rank's registration as a prefill
// rank's: decode ranks are not listed there (at start or at a rejoin).
Status ManagerImpl::ListRank(const RankRecord& rec) {
  if (sglang_registry_ && opts_.role == Role::kDecode) return Status();
  return registry_->RegisterRank(rec);
}

void ManagerImpl::MaybeRejoin() {
  FailureRecord why;
  bool fenced = false;
  Outbox out;
  {
    MutexLock lock(mu_);
    if (!declared_failed_ || !fatal_ || registry_lost_) return;
    // Writes the old incarnation posted where decode cannot revoke them (a
    // same-host peer with no grant writes through shared memory) finish
    // first (each completes or fails within the transport's bound), while
    // their peers are still there to be told Quiesced: decode counts such a
    // room quiesced only on that word, or on seeing this process come back
    // under a new incarnation (write_rule.h, kRejoined), which must then mean
    // nothing is left. Revocable writes need no wait: decode revokes them.
    if (unrevocable_chunks_ > 0) {  // of every room, released ones too
      if (rejoin_waits_++ == rejoin_waits_logged_)
        KVB_LOG_INFO("not rejoining yet: {} chunks of incarnation {:#x} still in flight",
                     unrevocable_chunks_, incarnation_.load());
      return;
    }
    rejoin_waits_logged_ = rejoin_waits_;  // the next wait is logged again
    why = *declared_failed_;
    fenced = RetirePeersLocked(why, out);
  }
  Flush(out);
  if (!fenced) {
    FenceRound();  // revokes the retired peers' grants now, not next fence round
    Outbox again;
    {
      MutexLock lock(mu_);
      fenced = RetirePeersLocked(why, again);
    }
    Flush(again);
  }
  if (!fenced) {
    // A revoke the fence thread runs, or one that did not finish
    // (FenceRound logs why): next round.
    KVB_LOG_INFO("not rejoining yet: a write grant this rank gave a peer is not revoked");
    return;
  }
  RankRecord rec;
  {
    // The new incarnation is taken before it registers: no peer knows it
    // until the registry lists it, and the fence holds until it does.
    MutexLock lock(mu_);
    if (rejoin_from_ == 0) {
      rejoin_from_ = incarnation_.load();
      incarnation_.store(NewIncarnation());
    }
    rec = MakeRankRecord();
  }
  if (rank_endpoint_) rec.rank_port = rank_endpoint_->port();
  Status registered = ListRank(rec);
  if (!registered.ok()) {
    if (rejoin_register_failures_++ % 100 == 0)
      KVB_LOG_WARN("not rejoining yet ({} tries): registering incarnation {:#x}: {}",
                   rejoin_register_failures_, rec.incarnation, registered.ToString());
    return;
  }
  rejoin_register_failures_ = 0;
  if (rank_endpoint_) rank_endpoint_->SetRecord(rec.ToJson().dump());
  {
    MutexLock lock(mu_);
    FinishRejoinLocked(std::exchange(rejoin_from_, 0));
  }
}

void ManagerImpl::FinishRejoinLocked(uint64_t from) {
  const FailureRecord why = *declared_failed_;
  fatal_.reset();
  declared_failed_.reset();
  // What the old incarnation blamed on others and kept local was about its
  // own isolation: it must not block the new one's rooms. What the registry
  // holds stays, this rank's own published findings too (KeptAcrossRejoin).
  for (auto it = dead_ranks_.begin(); it != dead_ranks_.end();) {
    const std::pair<std::string, uint64_t> applied{it->first, it->second.origin.incarnation};
    if (KeptAcrossRejoin(it->second, Self(), published_.count(applied) > 0)) {
      ++it;
      continue;
    }
    applied_.erase(applied);
    it = dead_ranks_.erase(it);
  }
  std::erase_if(publish_queue_, [&](const FailureRecord& r) { return !r.origin.SameRank(Self()); });
  ++rejoins_;
  KVB_LOG_WARN(
      "this rank rejoined under incarnation {:#x} after being declared failed by {}; incarnation "
      "{:#x} stays fenced (its rooms failed, its grants revoked): {}",
      incarnation_.load(), why.detected_by.ShortName(), from, why.Message());
}

}  // namespace kvbridge::internal
