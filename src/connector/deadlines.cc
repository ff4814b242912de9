// Phase deadlines: requests that wait too long for metadata, input,
// chunks or their bootstrap fail naming what they waited for, and
// bookkeeping of notices for senders that never came expires.
#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "common/log.h"
#include "connector/manager_impl.h"

namespace kvbridge::internal {

void ManagerImpl::TickSendersLocked(SteadyTime now, Outbox& out) {
  for (auto pm = pending_meta_.begin(); pm != pending_meta_.end();) {
    pm = now - pm->second.at > opts_.waiting_timeout ? pending_meta_.erase(pm) : std::next(pm);
  }
  for (auto o = orphan_failures_.begin(); o != orphan_failures_.end();) {
    o = now - o->second.at > opts_.waiting_timeout ? orphan_failures_.erase(o) : std::next(o);
  }
  for (auto pa = pending_abort_.begin(); pa != pending_abort_.end();) {
    pa = now - pa->second.at > opts_.waiting_timeout ? pending_abort_.erase(pa) : std::next(pa);
  }
  for (auto& [id, sp] : senders_) {
    SenderRoom& room = *sp;
    if (room.failure) continue;
    KVPoll p = room.poll();
    if (p == KVPoll::kSuccess) continue;
    if (p == KVPoll::kBootstrapping) {
      // Metadata that cannot come: registry lost (decode cannot bootstrap),
      // or a rank of the instances involved is gone.
      if (auto blocker = NewRoomBlockerLocked()) {
        FailSenderLocked(room, *blocker, out);
        continue;
      }
    }
    auto elapsed = now - room.phase_since;
    if (room.inflight > 0) {
      if (elapsed <= opts_.transfer_timeout) continue;
      for (auto& [rank, flow] : room.flows) {
        if (flow.inflight == 0) continue;
        FailureRecord r = MakeRecord(
            flow.decode, FailureCause::kDeadlineExceeded,
            fmt::format("writes to {} not completed within {:.1f} s", flow.decode.ShortName(),
                        std::chrono::duration<double>(opts_.transfer_timeout).count()),
            Phase::kTransferring, "transfer deadline");
        r.generation = flow.meta.generation;
        FailSenderLocked(room, r, out);
        break;
      }
      continue;
    }
    if (elapsed <= opts_.waiting_timeout) continue;
    std::string what;
    Phase phase = room.phase;
    RankId origin = Self();
    if (p == KVPoll::kBootstrapping) {
      phase = Phase::kWaitingForMetadata;
      std::string missing;
      for (int d : room.expected_decode) {
        if (room.flows.count(d)) continue;
        missing += fmt::format(" tp{}", d);
        // Name the silent decode rank when this rank has met it.
        for (auto& [key, peer] : peers_)
          if (peer->id->role == Role::kDecode && peer->id->tp == d && origin.SameRank(Self()))
            origin = peer->id;
      }
      what = missing.empty() ? "no decode rank sent metadata" : "no metadata from decode" + missing;
    } else {
      what = "the application sent no chunk";
    }
    FailSenderLocked(
        room,
        MakeRecord(origin, FailureCause::kDeadlineExceeded,
                   fmt::format("{} within {:.1f} s", what,
                               std::chrono::duration<double>(opts_.waiting_timeout).count()),
                   phase, "phase deadline"),
        out);
  }
}

void ManagerImpl::TickReceiversLocked(SteadyTime now, Outbox& out) {
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
      const Status why = room.last_resolve_error ? *room.last_resolve_error : Status();
      bool lost = why.message().find("unreachable") != std::string::npos;
      RankId origin;
      if (lost) {
        origin.role = Role::kBootstrap;
        origin.host = registry_->address();
      } else {
        origin = Self();
      }
      FailReceiverLocked(
          room,
          MakeRecord(origin, lost ? FailureCause::kRegistryLost : FailureCause::kDeadlineExceeded,
                     why.ok() ? "prefill instance not found" : why.message(), Phase::kBootstrapping,
                     lost ? "registry" : "phase deadline"),
          out);
      continue;
    }
    if (!room.meta_given) {
      if (elapsed <= opts_.waiting_timeout) continue;
      FailReceiverLocked(room,
                         MakeRecord(Self(), FailureCause::kDeadlineExceeded,
                                    "the application did not call SendMetadata",
                                    Phase::kWaitingForMetadata, "phase deadline"),
                         out);
      continue;
    }
    if (elapsed <= opts_.waiting_timeout) continue;
    for (const ReceiverSource& src : room.sources) {
      if (src.dummy || src.last_received) continue;
      FailReceiverLocked(
          room,
          MakeRecord(src.prefill, FailureCause::kDeadlineExceeded,
                     fmt::format("no chunk from {} for {:.1f} s", src.prefill->ShortName(),
                                 std::chrono::duration<double>(elapsed).count()),
                     room.phase, "phase deadline"),
          out);
      break;
    }
  }
}

void ManagerImpl::RetryUnresolved() {
  std::vector<std::shared_ptr<ReceiverRoom>> todo;
  {
    // Only the rooms initialized since they were last seen resolved (not
    // every room in flight: with 10,000 that held the mutex for ms a round).
    MutexLock lock(mu_);
    std::vector<uint64_t> ids = std::exchange(unresolved_, {});
    std::sort(ids.begin(), ids.end());  // a room id reused is listed once
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    for (uint64_t id : ids) {
      auto it = receivers_.find(id);
      if (it == receivers_.end()) continue;
      const auto& room = it->second;
      if (!room->initialized || room->resolved || room->failure) continue;
      todo.push_back(room);
      unresolved_.push_back(id);
    }
  }
  for (auto& room : todo) ResolveSources(room).IgnoreError();
}

}  // namespace kvbridge::internal
