// Prefill: what a rank holds about a request (room, decode tp rank,
// generation) that no live sender has a flow for. Decode's metadata can come
// before the sender is created; decode's failure notice can come before the
// sender, before its metadata, or after the sender was released; a sender
// can fail before any metadata came. What each of those means is one rule,
// kept apart from the manager so that it is tested alone: no I/O, no clock
// (the time is passed in), no lock (the manager's mutex guards it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "connector/peer_state.h"
#include "connector/protocol.h"

namespace kvbridge::internal {

// The decode generations whose requests released senders of a room served
// (one per decode tp rank and room, the newest): a notice that comes later
// about one of them is about a request prefill has closed, not about the
// room's next use, which it must not fail. Bounded: past `limit` entries
// the oldest are forgotten.
class ClosedFlows {
 public:
  explicit ClosedFlows(size_t limit) : limit_(limit) {}
  void Note(uint64_t room, int decode_tp, uint64_t generation);
  bool Holds(uint64_t room, int decode_tp, uint64_t generation) const;
  size_t size() const { return last_.size(); }

 private:
  const size_t limit_;
  std::map<std::pair<uint64_t, int>, uint64_t> last_;
  std::deque<std::pair<uint64_t, int>> order_;  // each key once, oldest first
};

// Decode failed a request before prefill had a flow for it.
struct PendingAbort {
  FailureRecord record;
  uint64_t generation = 0;
  SteadyTime at;
};

class SenderInbox {
 public:
  // `max_pending`: held metadata, and held aborts, each at most this many
  // (ManagerOptions::max_pending_requests). `closed_memory`: ClosedFlows'.
  // `max_held_entries`: page and state indices over all held metadata
  // (each message may carry 2^24 of each: a count alone let a decode peer
  // hold gigabytes here).
  static constexpr size_t kMaxHeldEntries = size_t{1} << 24;  // 64 MiB of int32
  explicit SenderInbox(size_t max_pending, size_t closed_memory = 8192,
                       size_t max_held_entries = kMaxHeldEntries)
      : max_pending_(max_pending), max_entries_(max_held_entries), closed_(closed_memory) {}

  // Metadata for a room with no live sender.
  struct MetaVerdict {
    enum Kind {
      kHeld,          // kept for the sender to come
      kAnswerFailed,  // this request already failed: answer with `record`
      kOverLimit,     // max_pending metadata, or max_held_entries, held: fail the request
    } kind = kHeld;
    FailureRecord record;  // kAnswerFailed: generation set to the metadata's
  };
  MetaVerdict OnMetaWithoutSender(MetaMsg meta, const RankId& from, SteadyTime now);

  // Metadata of a newer use of a room whose live sender already has a flow
  // from that rank: kept for the room's next sender (one per room and decode
  // rank), within the same bounds as OnMetaWithoutSender; false: not kept
  // (over a bound: the caller fails that request).
  bool HoldForNextSender(MetaMsg meta, const RankId& from, SteadyTime now);

  // A live sender is about to adopt this metadata: a held abort from that
  // rank is used up. Its record when it is about this very request (the
  // notice overtook the metadata: nothing may be written); nullopt when
  // none is held or it was about an older use of the room.
  std::optional<FailureRecord> TakeAbortFor(uint64_t room, int decode_tp, uint64_t generation);

  // A decode notice that matched no flow. True: it is about a request a
  // released sender served, and the room's next use is not its concern.
  // False: held (bounded) for the sender or metadata to come, and metadata
  // of that same request held here is dropped.
  bool OnNoticeWithoutFlow(uint64_t room, int decode_tp, uint64_t generation,
                           const FailureRecord& record, SteadyTime now);

  // A new sender for `room`: the aborts it fails with (by decode tp) and
  // the metadata it adopts, both no longer held; a failure kept from the
  // room's last use is forgotten.
  struct ForNewSender {
    std::vector<std::pair<int, PendingAbort>> aborts;
    std::vector<PendingMeta> metas;
  };
  ForNewSender TakeForNewSender(uint64_t room);

  // A sender was released. `flows`: (decode tp, generation) of each flow it
  // had (closed from now on). `failure`: its record if it failed before any
  // metadata came (null otherwise), kept to answer metadata that comes
  // later for the room; `aborted`: the decode generations it is known to be
  // (a newer one from that rank is a new request).
  void OnSenderReleased(uint64_t room, const std::vector<std::pair<int, uint64_t>>& flows,
                        const FailureRecord* failure, const std::map<int, uint64_t>& aborted,
                        SteadyTime now);

  // Drops everything held longer than `max_age` (closed flows stay).
  void Expire(SteadyTime now, std::chrono::steady_clock::duration max_age);
  // Drops held metadata from senders `from_peer` says yes to (a failed
  // peer), or all of it (a rejoin: none is for the new incarnation).
  void DropMetaIf(const std::function<bool(const RankId&)>& from_peer);
  void DropAllMeta() {
    meta_.clear();
    entries_ = 0;
  }

  size_t held_metadata() const { return meta_.size(); }
  size_t held_entries() const { return entries_; }  // page and state indices
  size_t held_aborts() const { return aborts_.size(); }
  size_t held_failures() const { return failures_.size(); }

 private:
  // A sender that failed before any metadata came.
  struct KeptFailure {
    FailureRecord record;
    std::map<int, uint64_t> generations;  // decode tp -> generation it was about
    SteadyTime at;
  };
  using Key = std::pair<uint64_t, int>;  // (room, decode tp)

  using Held = std::map<Key, PendingMeta>;
  static size_t Entries(const MetaMsg& m) { return m.pages.size() + m.state.size(); }
  bool Fits(const Key& key, const MetaMsg& meta) const;  // within both bounds, replacing key's
  void Put(const Key& key, PendingMeta held);            // meta_ and entries_ together
  Held::iterator Erase(Held::iterator it);

  const size_t max_pending_;
  const size_t max_entries_;
  Held meta_;
  size_t entries_ = 0;
  std::map<Key, PendingAbort> aborts_;
  std::map<uint64_t, KeptFailure> failures_;
  ClosedFlows closed_;
};

}  // namespace kvbridge::internal
