// Phase deadlines: requests that wait too long for metadata, input,
// chunks or their bootstrap fail naming what they waited for, and
// bookkeeping of notices for senders that never came expires.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "common/log.h"
#include "connector/deadline_rule.h"
#include "connector/manager_impl.h"
#include "connector/record_tag.h"

namespace kvbridge::internal {

namespace {

PhaseTimeouts TimeoutsOf(const ManagerOptions& o) {
  return {o.bootstrap_timeout, o.waiting_timeout, o.transfer_timeout};
}

}  // namespace

void ManagerImpl::TickSendersLocked(SteadyTime now, Outbox& out) {
  inbox_.Expire(now, opts_.waiting_timeout);
  // The decode ranks this rank met: a request whose metadata never came
  // names the silent one of the group whose metadata came (SilentDecodeRank).
  std::vector<RankId> met_decode;
  for (auto& [key, peer] : peers_)
    if (peer->id->role == Role::kDecode) met_decode.push_back(peer->id);
  for (auto& [id, sp] : senders_) {
    SenderRoom& room = *sp;
    if (room.failure) continue;
    KVPoll p = room.poll();
    if (p == KVPoll::kSuccess) continue;
    if (p == KVPoll::kBootstrapping && room.restart_check == 0) {
      // Metadata that cannot come: registry lost (decode cannot bootstrap),
      // or a rank of the instances involved is gone (for a room awaiting its
      // restart check, the check decides).
      if (auto blocker = NewRoomBlockerLocked()) {
        FailSenderLocked(room, *blocker, out);
        continue;
      }
    }
    auto breach = SenderDeadline(room, now, TimeoutsOf(opts_), met_decode);
    if (!breach) continue;
    FailureRecord r = MakeRecord(breach->origin.value_or(Self()), FailureCause::kDeadlineExceeded,
                                 std::move(breach->detail), breach->phase, breach->mechanism);
    r.generation = breach->generation;
    FailSenderLocked(room, r, out);
  }
}

void ManagerImpl::TickReceiversLocked(SteadyTime now, Outbox& out) {
  // The peers whose handshake is pending (few), for ReceiverDeadline.
  std::map<std::string, PendingHandshake> handshakes;
  for (const auto& [key, peer] : peers_)
    if (!peer->acked) handshakes[key] = PendingHandshake{peer->refusals, peer->refusal};
  for (auto& [id, sp] : receivers_) {
    ReceiverRoom& room = *sp;
    WarnUnsettledLocked(room, now);
    if (room.failure || !room.initialized || room.poll() == KVPoll::kSuccess) continue;
    auto elapsed = now - room.phase_since;
    // Registry lost: requests whose transfer has not started fail naming it
    // (prefill fails the ones still waiting for metadata the same way, so
    // the two sides never wait on each other); transfers under way finish.
    if (registry_lost_ && (!room.resolved || room.poll() == KVPoll::kWaitingForInput)) {
      FailReceiverLocked(room, *registry_lost_, out);
      continue;
    }
    if (!room.resolved) {
      if (elapsed <= opts_.bootstrap_timeout) continue;
      const Status why = room.last_resolve_error ? room.last_resolve_error->why : Status();
      RankId origin = Self();
      FailureCause cause = FailureCause::kDeadlineExceeded;
      const char* mechanism = "phase deadline";
      if (room.last_resolve_error && room.last_resolve_error->unanswered) {
        // The registry answered; the prefill rank it listed did not.
        origin = *room.last_resolve_error->unanswered;
        cause = FailureCause::kPeerUnreachable;
        mechanism = "bootstrap lookup";
      } else if (why.code() == StatusCode::kUnavailable &&
                 why.message().find("unreachable") != std::string::npos) {
        // The registry's own answer when it did not answer (registry_client.h).
        origin = RankId{};
        origin.role = Role::kBootstrap;
        origin.host = registry_->address();
        cause = FailureCause::kRegistryLost;
        mechanism = "registry";
      }
      FailReceiverLocked(
          room,
          MakeRecord(origin, cause, why.ok() ? "prefill instance not found" : why.message(),
                     Phase::kBootstrapping, mechanism),
          out);
      continue;
    }
    if (auto b = ReceiverDeadline(room, now, TimeoutsOf(opts_), [&](const ReceiverSource& s) {
          auto it = handshakes.find(s.peer_key);
          return it == handshakes.end() ? std::nullopt : std::optional(it->second);
        }))
      FailReceiverLocked(room,
                         MakeRecord(b->origin.value_or(Self()), FailureCause::kDeadlineExceeded,
                                    std::move(b->detail), b->phase, b->mechanism),
                         out);
  }
}

void ManagerImpl::RetryUnresolved() {
  std::vector<std::shared_ptr<ReceiverRoom>> todo;
  {
    // Only the rooms initialized since they were last seen resolved (not
    // every room in flight: with 10,000 that held the mutex for ms a round).
    MutexLock lock(mu_);
    todo = std::exchange(unresolved_, {});
    std::sort(todo.begin(), todo.end());  // a room listed twice is resolved once
    todo.erase(std::unique(todo.begin(), todo.end()), todo.end());
    std::erase_if(todo, [](const auto& room) { return !room->initialized || room->resolved; });
    unresolved_ = todo;
  }
  if (todo.empty()) return;
  // Every room needs prefill's parallel info: while the registry cannot
  // give it, one lookup says so for all (not one wait per room).
  if (Result<ParallelInfo> info = PrefillParallelInfo(); !info.ok()) {
    for (auto& room : todo) FailUnresolved(*room, AnsweredWrongly(info.status()), std::nullopt);
    return;
  }
  for (auto& room : todo) {
    if (stop_.load()) return;  // the manager is closing: no more lookups
    ResolveSources(room).IgnoreError();
    // A room that failed before its sources were known (an abort right
    // after Init; released since, maybe) is resolved once all the same,
    // only so that the prefill ranks at its positions learn why
    // (AdoptSourcesLocked tells them): their senders would otherwise wait
    // for metadata until their deadline.
    MutexLock lock(mu_);
    if (room->failure) std::erase(unresolved_, room);
  }
}

}  // namespace kvbridge::internal
