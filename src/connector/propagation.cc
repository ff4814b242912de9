// Failure propagation: a failure detected anywhere reaches every rank with a
// request touching the failed rank, directly (RoomFailed / RankFailed
// messages) and through the registry (published records every rank polls;
// the registry's liveness table for siblings that share no connection).
#include <fmt/format.h>

#include "common/log.h"
#include "common/process.h"
#include "connector/manager_impl.h"
#include "connector/rank_failure_rule.h"
#include "connector/relay_rule.h"
#include "connector/room_failure_rule.h"
#include "control/record_json.h"

namespace kvbridge::internal {
RankRole ToRankRole(Role r) { return r == Role::kPrefill ? RankRole::kPrefill : RankRole::kDecode; }

// The rank a registry record describes.
RankId RankIdOf(const RankRecord& record) {
  RankId id;
  id.role = record.role == RankRole::kPrefill ? Role::kPrefill : Role::kDecode;
  id.dp = record.attn_dp_rank;
  id.tp = record.attn_tp_rank;
  id.pp = record.pp_rank;
  id.cp = record.attn_cp_rank;
  id.host = record.host;
  id.boot_id = record.boot_id;
  id.pid = static_cast<int>(record.pid);
  id.incarnation = record.incarnation;
  id.instance = record.instance;
  return id;
}

namespace {

// Bounds on what one rank keeps of failure records (a storm of aborts or
// bad requests must not grow memory or flood the registry).
constexpr size_t kMaxQueuedRecords = 1024;
// What lost packets add to a remote rank's gap between heartbeats at the
// registry (each a connect tried again or a retransmission, 200-250 ms;
// control/bootstrap_client.cc): two in one round.
constexpr std::chrono::milliseconds kLossGrace{500};
constexpr size_t kMaxRoomRecords = 256;

}  // namespace

void ManagerImpl::PublishLocked(const FailureRecord& record) {
  if (sglang_registry_) return;  // it keeps none: peers tell each other (TellWitnesses)
  const bool self_record = record.origin.SameRank(Self());
  if (fatal_ && !self_record) return;  // a failed rank blames nobody else
  const bool rank_record = IsRankFailure(record.cause) && record.origin.role != Role::kBootstrap;
  if (!rank_record && !IsRoomRecord(record)) return;
  if (publish_queue_.size() >= kMaxQueuedRecords) {
    KVB_LOG_WARN("{} failure records wait for the registry; not publishing: {}",
                 publish_queue_.size(), record.Message());
    return;
  }
  publish_queue_.push_back(record);
}

template <typename Room>
bool ManagerImpl::SameRequest(const Room& room, const FailureRecord& record) {
  return room.room == record.room && room.created_wall <= record.detected_at;
}

void ManagerImpl::ApplyRoomFailureLocked(const FailureRecord& r, Outbox& out) {
  if (!IsRoomRecord(r)) return;
  if (r.detected_by.SameRank(Self()) && r.detected_by.incarnation == incarnation_.load()) return;
  for (const FailureRecord& seen : room_records_)
    if (seen.room == r.room && seen.detected_at == r.detected_at &&
        seen.detected_by.SameRank(r.detected_by))
      return;  // applied already (told by a peer and read from the registry)
  room_records_.push_front(r);
  if (room_records_.size() > kMaxRoomRecords) room_records_.pop_back();
  // A decode rank's record is about the request of its decode group only
  // (another group may use the same room id here).
  if (auto s = senders_.find(r.room);
      s != senders_.end() && SameRequest(*s->second, r) &&
      (r.origin.role != Role::kDecode || OfRoomDecodeGroup(*s->second, r.origin)))
    FailSenderLocked(*s->second, r, out);
  if (auto d = receivers_.find(r.room); d != receivers_.end() && SameRequest(*d->second, r))
    FailReceiverLocked(*d->second, r, out);
  room_records_cv_.notify_all();
}

// With sglang's server no registry carries a room's record: a notice from a
// decode rank this one has no metadata from (it may read nothing from here)
// is kept for this rank's group poll and passed to the other decode ranks
// of that instance, which may already hold their share and then hear of the
// failure from nobody else (docs/sglang.md, B3). Generation 0: their own
// generation of the room is not known here; they match it by time
// (SameRequest).
void ManagerImpl::RelayRoomFailureLocked(const RankId& from, const RoomFailedMsg& msg,
                                         Outbox& out) {
  if (RoomRecordRefusal(msg)) return;
  // Not applied to a request here that another decode group holds the
  // room id for (OfRoomDecodeGroup); still passed to `from`'s group.
  auto s = senders_.find(msg.room);
  if (s == senders_.end() || !s->second->live || OfRoomDecodeGroup(*s->second, from))
    ApplyRoomFailureLocked(msg.record, out);
  for (auto& [key, p] : peers_) {
    const RankId& id = p->id;
    if (p->failed || !p->ready || id.role != Role::kDecode || id.instance != from.instance ||
        id.SameRank(from))
      continue;
    Send(out, *p, RoomFailedMsg{msg.room, 0, true, msg.record});
  }
}

template <typename Room>
std::optional<FailureRecord> ManagerImpl::RoomRecordLocked(const Room& room) const {
  for (const FailureRecord& r : room_records_)
    if (SameRequest(room, r)) return r;
  return std::nullopt;
}

template <typename Room>
FailureRecord ManagerImpl::GroupFailure(const Room& room) {
  auto known = [&]() KVB_REQUIRES(mu_) -> std::optional<FailureRecord> {
    if (room.failure) return *room.failure;
    std::optional<FailureRecord> r = RoomRecordLocked(room);
    if (r) r->is_from_another_rank = IsFromAnotherRank(r->origin);  // as this rank holds it
    return r;
  };
  {
    MutexLock lock(mu_);
    if (auto f = known()) return *f;
  }
  // The registry thread reads the records, woken at once and after each
  // of three intervals (the record may reach the registry after this call;
  // one read at the start missed a sibling's record under ASan), and the
  // last read has one more interval to arrive: this thread only waits, so
  // a registry that does not answer holds it up no longer than the wait.
  // A real wait of the caller's thread (the I/O shell), so on the system's
  // clock, not the core's.
  constexpr int kReads = 4;
  const auto wait = opts_.heartbeat_interval * kReads;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (int wakes = 0;; ++wakes) {
    if (wakes < kReads) WakeRegistryRound();
    MutexLock lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    if (known() || now >= deadline) break;
    lock.WaitFor(room_records_cv_,
                 std::min<std::chrono::nanoseconds>(opts_.heartbeat_interval, deadline - now),
                 [&]() KVB_REQUIRES(mu_) { return known().has_value(); });
  }
  MutexLock lock(mu_);
  if (auto f = known()) return *f;
  FailureRecord r;
  const std::string where = fmt::format("room {} failed on another rank of this group", room.room);
  if (recent_rank_failure_) {
    r = *recent_rank_failure_;
    r.detail = fmt::format("{}; the latest rank failure known here: {}", where, r.detail);
  } else {
    r = MakeRecord(Self(), FailureCause::kAborted,
                   fmt::format("{}; no record of why reached {} within {} ms (from its peers or "
                               "the registry at {})",
                               where, self_.ShortName(), wait.count(), registry_->address()),
                   Phase::kTransferring, kGroupPollMechanism);
    r.hint = "look at the other ranks' errors for this room";
  }
  r.room = room.room;
  r.is_from_another_rank = true;
  return r;
}
template FailureRecord ManagerImpl::GroupFailure(const SenderRoom&);
template FailureRecord ManagerImpl::GroupFailure(const ReceiverRoom&);

std::optional<FailureRecord> ManagerImpl::RecentRankFailure() const {
  MutexLock lock(mu_);
  return recent_rank_failure_;
}

std::optional<FailureRecord> ManagerImpl::NewRoomBlockerLocked() const {
  if (fatal_) return fatal_;
  if (registry_lost_) return registry_lost_;
  for (const auto& [key, record] : dead_ranks_) {
    if (IsSibling(record.origin)) return record;  // a sibling of this instance is gone
    // Prefill: a rank of the decode instance is gone, so its requests'
    // metadata would never come. With several decode instances, which one a
    // new request is from shows only when its metadata arrives
    // (DeadRankOfInstanceLocked); here only when every decode rank met is
    // of the dead rank's instance.
    if (self_.role == Role::kPrefill && record.origin.role == Role::kDecode &&
        OnlyDecodeInstanceLocked(record.origin.instance))
      return record;
  }
  return std::nullopt;
}

bool ManagerImpl::IsSibling(const RankId& id) const {
  return id.role == self_.role && id.dp == self_.dp && id.instance == self_.instance &&
         !id.SameRank(Self());
}

bool ManagerImpl::OnlyDecodeInstanceLocked(const std::string& instance) const {
  for (const auto& [key, peer] : peers_)
    if (peer->id->role == Role::kDecode && peer->id->instance != instance) return false;
  for (const auto& [key, record] : dead_ranks_)
    if (record.origin.role == Role::kDecode && record.origin.instance != instance) return false;
  return true;
}

const FailureRecord* ManagerImpl::DeadRankOfInstanceLocked(const RankId& decode) const {
  for (const auto& [key, record] : dead_ranks_)
    if (record.origin.role == Role::kDecode && record.origin.instance == decode.instance &&
        record.origin.dp == decode.dp && !record.origin.SameRank(decode))
      return &record;
  return nullptr;
}

bool ManagerImpl::ReplacedLocked(const RankId& origin,
                                 const std::map<std::string, uint64_t>* live) {
  const std::string key = PeerKey(origin);
  if (live != nullptr) {
    auto it = live->find(key);
    if (it != live->end() && it->second != origin.incarnation) return true;
  }
  const Peer* p = FindPeerLocked(key);
  return p != nullptr && p->ready && p->acked && !p->failed &&
         p->id->incarnation != origin.incarnation;
}

void ManagerImpl::ApplyRankFailureLocked(const FailureRecord& r, Outbox& out,
                                         const std::map<std::string, uint64_t>* live) {
  const std::string key = PeerKey(r.origin);
  RankFailureFacts facts;
  facts.about_self = r.origin.SameRank(Self());
  facts.current_incarnation = r.origin.incarnation == incarnation_.load();
  facts.this_rank_failed = fatal_.has_value();
  facts.applied = DeclaredFailedLocked(r.origin);
  // Asked by JudgeRankFailure before it returns, so under mu_ (which the
  // analysis cannot see through std::function).
  facts.replaced = [&]() KVB_NO_THREAD_SAFETY_ANALYSIS { return ReplacedLocked(r.origin, live); };
  facts.failed_it_first = [&]() KVB_NO_THREAD_SAFETY_ANALYSIS { return FailedItFirstLocked(r); };
  switch (JudgeRankFailure(r, facts)) {
    case RankFailureAction::kIgnore:
      return;
    case RankFailureAction::kDropStale:
      // Late news of a process that has already been replaced (a slow
      // detector, a record read after the restart): the requests running now
      // belong to its successor, so nothing fails. Rooms that involved the
      // old process failed when it was replaced.
      applied_.insert({key, r.origin.incarnation});
      ++stale_dropped_;
      KVB_LOG_INFO("ignoring a late failure record about a replaced process: {}", r.Message());
      return;
    case RankFailureAction::kFenceSelf:
      // Others declared this process failed (e.g. it was stopped): it is
      // fenced until restarted, so nothing it does now can land on stale pages.
      KVB_LOG_ERROR("this rank was declared failed by {}: {}", r.detected_by.ShortName(),
                    r.Message());
      fatal_ = r;
      declared_failed_ = r;  // it rejoins once it can (MaybeRejoin)
      for (auto& [id, room] : senders_) FailSenderLocked(*room, r, out);
      for (auto& [id, room] : receivers_) FailReceiverLocked(*room, r, out);
      return;
    case RankFailureAction::kApply:
      break;
  }
  applied_.insert({key, r.origin.incarnation});
  dead_ranks_[key] = r;
  recent_rank_failure_ = r;
  KVB_LOG_WARN("learned of a failed rank: {}", r.Message());
  Peer* peer = FindPeerLocked(key);
  if (peer != nullptr && peer->id->incarnation == r.origin.incarnation && !peer->failed)
    FailPeerWithRecordLocked(*peer, r, out);
  const bool sibling = IsSibling(r.origin);
  for (auto& [id, room] : senders_)
    if (RankFailureTouches(r.origin, sibling, *room)) FailSenderLocked(*room, r, out);
  for (auto& [id, room] : receivers_)
    if (RankFailureTouches(r.origin, sibling, *room)) FailReceiverLocked(*room, r, out);
}

// With sglang's server, of two ranks that failed each other the one failed
// first is fenced, as a registry would have it: a peer this rank failed
// before it failed this one (stopped, it found its session closed when it
// resumed and failed this rank) is told so in turn (OnMessage:
// TellFailedPeerLocked) and its word is not taken.
bool ManagerImpl::FailedItFirstLocked(const FailureRecord& notice) {
  if (!sglang_registry_) return false;
  const Peer* p = FindPeerLocked(PeerKey(notice.detected_by));
  if (p == nullptr || !p->failed || !p->failure ||
      !IsFailureNotice(*p->failure, notice.detected_by, Self()) ||
      p->failure->detected_at >= notice.detected_at)
    return false;
  ++stale_dropped_;
  KVB_LOG_WARN("not fenced by {}, which this rank failed first ({}); telling it so",
               notice.detected_by.ShortName(), p->failure->Message());
  return true;
}

void ManagerImpl::BeatRound() {
  if (sglang_registry_) return;  // it keeps no liveness or records: peers tell
  const SteadyTime now = Now();
  const uint64_t incarnation = incarnation_.load();
  Status beat = registry_->Heartbeat(ToRankRole(self_.role), self_.dp, self_.cp, self_.tp, self_.pp,
                                     incarnation);
  if (beat.code() == StatusCode::kUnavailable) {
    if (!registry_down_since_) registry_down_since_ = now;
    MutexLock lock(mu_);
    if (!registry_lost_ &&
        now - *registry_down_since_ >= opts_.heartbeat_interval * opts_.heartbeat_misses) {
      RankId origin;
      origin.role = Role::kBootstrap;
      origin.host = registry_->address();
      // A registry this rank never reached was not lost: say so.
      const std::string why = registry_reached_
                                  ? beat.message()
                                  : "never reached since this rank started: " + beat.message();
      registry_lost_ = MakeRecord(origin, FailureCause::kRegistryLost, why, Phase::kBootstrapping,
                                  "registry heartbeat");
      KVB_LOG_ERROR("{}", registry_lost_->Message());
    }
    return;
  }
  registry_down_since_.reset();
  registry_reached_ = true;
  bool act = false;
  {
    MutexLock lock(mu_);
    registry_answered_ = WallNow();
    if (beat.code() == StatusCode::kFailedPrecondition) {
      act = !heartbeat_refused_ && !fatal_;
      heartbeat_refused_ = HeartbeatRefusal{incarnation, beat.message()};
    } else if (beat.ok()) {
      heartbeat_refused_.reset();
    }
    if (registry_lost_) {
      KVB_LOG_WARN("registry {} reachable again", registry_->address());
      registry_lost_.reset();
    }
  }
  if (act) WakeRegistryRound();  // the registry round acts on it now
}

namespace {

// The incarnation of every live rank `ranks` lists, by `key`.
std::map<std::string, uint64_t> LiveIncarnations(
    const std::optional<std::vector<RankStatus>>& ranks, std::string (*key)(const RankId&)) {
  std::map<std::string, uint64_t> live;
  if (!ranks) return live;
  for (const RankStatus& s : *ranks)
    if (s.state == Liveness::kAlive) live[key(RankIdOf(s.record))] = s.record.incarnation;
  return live;
}

}  // namespace

void ManagerImpl::RegistryRound(uint64_t round) {
  if (sglang_registry_) {  // it keeps no liveness or records: peers tell
    MaybeRejoin();         // a peer that failed this rank said so
    return;
  }
  // When the registry had last answered before this round (as when the
  // heartbeat was part of the round): a heartbeat that ends a partition
  // must not make the blame gathered during it look fresh.
  std::chrono::system_clock::time_point answered_before = answered_seen_;
  uint64_t checks = 0;  // new rooms up to this one await a restart check
  bool lost = false;
  {
    MutexLock lock(mu_);
    answered_seen_ = registry_answered_;
    checks = restart_checks_;
    lost = registry_lost_.has_value();
  }
  const bool check = checks > restart_checks_settled_;
  restart_checks_settled_ = checks;
  if (lost) {  // the reads would fail too
    if (check) SettleRestartChecks(checks, nullptr);
    return;
  }
  // Read before publishing: a rank cut off from the others (a partition)
  // blamed them for its own isolation while the registry was out of reach;
  // if the others declared it failed meanwhile, it learns that here, is
  // fenced, and its queued blame is dropped below instead of failing
  // healthy ranks when the partition heals.
  Result<FailureBatch> batch = registry_->FailuresSince(failure_seq_);
  if (batch.ok()) failure_seq_ = batch->latest_seq;
  const bool have_records = batch.ok() && !batch->records.empty();
  // Who is alive now, read after the records (one read serves both uses):
  // a record about a process already replaced at its position must not fail
  // its successor's rooms; every third round it also checks the siblings.
  std::optional<std::vector<RankStatus>> ranks;
  bool refused = false;
  {
    MutexLock lock(mu_);
    refused = heartbeat_refused_.has_value() && !fatal_;
  }
  // Read after `checks`: any restart registered before those rooms were
  // created shows in it (etcd's watched copy first catches up with the
  // store: it may lag a registration).
  if (check) registry_->CatchUp().IgnoreError();
  if (have_records || refused || check || round % 3 == 0) {
    Result<std::vector<RankStatus>> listed = registry_->ListRanks();
    if (listed.ok()) ranks = std::move(listed).value();
  }
  if (have_records) {
    const std::map<std::string, uint64_t> live = LiveIncarnations(ranks, PeerKey);
    Outbox out;
    {
      MutexLock lock(mu_);
      for (const nlohmann::json& j : batch->records) {
        Result<FailureRecord> read = FailureRecordFromJson(j);
        if (!read.ok()) continue;
        const FailureRecord r = DatedNoLaterThan(std::move(read).value(), WallNow());
        // The registry holds it: a rejoin keeps it, even where this rank
        // held its own unpublished finding about the same process.
        if (auto held = RankFailureOfAnother(r, Self(), PeerKey)) published_.insert(*held);
        ApplyRankFailureLocked(r, out, ranks ? &live : nullptr);
        ApplyRoomFailureLocked(r, out);
      }
    }
    Flush(out);
  }
  if (refused && ranks) {
    Outbox out;
    {
      MutexLock lock(mu_);
      if (heartbeat_refused_) ApplyHeartbeatRefusalLocked(*heartbeat_refused_, *ranks, out);
      heartbeat_refused_.reset();  // acted on; a later refusal is news again
    }
    Flush(out);
  }
  if (check) SettleRestartChecks(checks, ranks ? &*ranks : nullptr);
  PublishQueued(answered_before);
  MaybeRejoin();
  if (round % 3 == 0 && ranks) CheckSiblings(*ranks);
}

void ManagerImpl::ApplyHeartbeatRefusalLocked(const HeartbeatRefusal& refusal,
                                              const std::vector<RankStatus>& ranks, Outbox& out) {
  // A record fenced it (applied as such), or the refusal was of an
  // incarnation this process has since left.
  if (fatal_ || refusal.incarnation != incarnation_.load()) return;
  const std::string& why = refusal.why;
  for (const RankStatus& s : ranks) {
    const RankId holder = RankIdOf(s.record);
    if (!holder.SameRank(Self()) || holder.incarnation == incarnation_.load() ||
        s.state != Liveness::kAlive)
      continue;
    // A restart of this rank while it lived on: rejoining would evict it.
    fatal_ = MakeRecord(Self(), FailureCause::kPeerExited,
                        fmt::format("replaced at its position by pid {} while it lived on "
                                    "(the registry refused its heartbeat: {})",
                                    holder.pid, why),
                        Phase::kTransferring, "registry heartbeat");
    KVB_LOG_ERROR("this rank stops for good: {}", fatal_->Message());
    for (auto& [id, room] : senders_) FailSenderLocked(*room, *fatal_, out);
    for (auto& [id, room] : receivers_) FailReceiverLocked(*room, *fatal_, out);
    return;
  }
  FailureRecord r = MakeRecord(Self(), FailureCause::kPeerUnresponsive,
                               "the registry counts this incarnation dead: " + why,
                               Phase::kTransferring, "registry heartbeat");
  ApplyRankFailureLocked(r, out);          // fenced, its rooms failed; rejoins (MaybeRejoin)
  publish_queue_.push_back(std::move(r));  // for the ranks that still count it alive
}

// Records still queued go before the manager does (its threads are
// joined). The registry thread publishes them once per heartbeat, and a
// manager dropped right after a failure (the sglang adapter's, when it
// evicts a dead prefill instance) took them with it: the other ranks of the
// request's group never learnt why. At most one registry timeout
// (PublishQueued stops at the first unreachable answer).
void ManagerImpl::PublishBeforeGoing() {
  if (!registry_ || sglang_registry_) return;  // sglang's server keeps no records
  {
    MutexLock lock(mu_);
    if (publish_queue_.empty() || registry_lost_) return;
  }
  PublishQueued(answered_seen_);
}

void ManagerImpl::PublishQueued(std::chrono::system_clock::time_point answered_before) {
  std::vector<FailureRecord> to_publish;
  bool fenced = false;
  {
    MutexLock lock(mu_);
    to_publish.swap(publish_queue_);
    publishing_ = to_publish.size();
    fenced = fatal_.has_value();
  }
  // The registry is the arbiter of a partition: the side that still reaches
  // it blames the side that does not. Blame this rank gathered while the
  // registry had not answered it for over half the silence limit is most
  // likely about its own isolation (a partition cuts both ways: each side
  // finds the other silent), so it stays local: this rank's rooms failed,
  // the registry does not declare the other rank failed. A fenced rank
  // blames nobody else (PublishLocked), also for what it queued before it
  // knew.
  const auto cut_off = (opts_.heartbeat_interval * opts_.heartbeat_misses) / 2;
  std::erase_if(to_publish, [&](const FailureRecord& r) {
    if (r.origin.SameRank(Self())) return false;
    if (fenced) return true;
    if (answered_before.time_since_epoch().count() == 0 ||
        r.detected_at - answered_before <= cut_off)
      return false;
    KVB_LOG_WARN(
        "not publishing blame of {} detected {:.2f} s after the registry last answered (this "
        "rank may be the one cut off): {}",
        r.origin.ShortName(),
        std::chrono::duration<double>(r.detected_at - answered_before).count(), r.Message());
    return true;
  });
  std::vector<FailureRecord> unsent;
  std::vector<std::pair<std::string, uint64_t>> published;  // rank failures the registry holds
  for (size_t i = 0; i < to_publish.size(); ++i) {
    Result<uint64_t> seq = registry_->PublishFailure(FailureRecordToJson(to_publish[i]));
    if (seq.ok()) {
      if (auto held = RankFailureOfAnother(to_publish[i], Self(), PeerKey))
        published.push_back(*held);
      continue;
    }
    KVB_LOG_WARN("failure record not published: {}", seq.status().ToString());
    // An unreachable registry (an etcd election, a restart) takes it and
    // the ones after it later: no record is lost to a registry outage, and
    // a round waits out one timeout, not one per record.
    if (seq.status().code() == StatusCode::kUnavailable) {
      unsent.assign(to_publish.begin() + static_cast<std::ptrdiff_t>(i), to_publish.end());
      break;
    }
  }
  MutexLock lock(mu_);
  publishing_ = 0;
  published_.insert(published.begin(), published.end());  // a rejoin keeps them (rejoin.cc)
  publish_queue_.insert(publish_queue_.begin(), unsent.begin(), unsent.end());
  if (publish_queue_.size() > kMaxQueuedRecords) publish_queue_.resize(kMaxQueuedRecords);
}

void ManagerImpl::CheckSiblings(const std::vector<RankStatus>& ranks) {
  const auto silence = opts_.heartbeat_interval * opts_.heartbeat_misses;
  const auto limit = silence * 2;
  Outbox out;
  {
    MutexLock lock(mu_);
    ForgetRestartedLocked(ranks);
    for (const RankStatus& s : ranks) {
      const RankId id = RankIdOf(s.record);
      if (fatal_ || !IsSibling(id)) continue;
      if (s.state == Liveness::kAlive && s.age <= limit) continue;
      if (DeclaredFailedLocked(id) || s.dead_by_seq != 0) continue;
      const ProcessState ps = LocalProcessState(id);
      if (ps == ProcessState::kRunning && s.age <= limit * 10) continue;  // busy, not failed
      const bool remote = ps == ProcessState::kUnknown && !OnThisHost(id);
      // The registry calls a rank unresponsive after one silence limit; a
      // remote sibling's heartbeat that crossed a lossy link may be that late
      // while the rank is fine, so it gets kLossGrace more (still within
      // `limit`, and detected within 2 s with the defaults and --hosts').
      if (remote && s.state != Liveness::kDead && s.age <= std::min(limit, silence + kLossGrace))
        continue;
      FailureCause cause = ps == ProcessState::kExited ? FailureCause::kPeerExited
                           : remote                    ? FailureCause::kPeerUnreachable
                                                       : FailureCause::kPeerUnresponsive;
      const std::string silence = fmt::format("no heartbeat at the registry for {:.2f} s",
                                              std::chrono::duration<double>(s.age).count());
      std::string detail = remote ? RemoteSilence(id, silence)
                           : ps == ProcessState::kRunning || ps == ProcessState::kUnknown
                               ? silence
                               : DescribeProcessState(ps);
      FailureRecord r = MakeRecord(id, cause, detail, Phase::kTransferring, "registry liveness");
      r.last_sign_of_life = WallNow() - s.age;
      ApplyRankFailureLocked(r, out);
      PublishLocked(r);
    }
  }
  Flush(out);
}

void ManagerImpl::ApplyRecordForTest(const FailureRecord& record, bool publish) {
  Outbox out;
  {
    MutexLock lock(mu_);
    ApplyRankFailureLocked(record, out);
    if (publish) PublishLocked(record);
  }
  Flush(out);
}

void ManagerImpl::LastWords(const std::string& reason) {
  FailureRecord r =
      MakeRecord(Self(), FailureCause::kLocalError, reason, Phase::kTransferring, "last words");
  std::vector<PeerId> peers;
  {
    // A dying process may have died holding the lock: never wait for it.
    if (mu_.try_lock()) {
      for (auto& [key, peer] : peers_)
        if (!peer->failed && peer->tpeer != 0) peers.push_back(peer->tpeer);
      mu_.unlock();
    }
  }
  std::string msg = EncodeMessage(Self(), RankFailedMsg{r});
  for (PeerId p : peers) transport_->SendUrgentMessage(p, msg).IgnoreError();
  registry_->PublishFailure(FailureRecordToJson(r)).status().IgnoreError();
}

}  // namespace kvbridge::internal
