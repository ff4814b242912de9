// Per-request state shared between a KVSender / KVReceiver and its manager.
//
// `state` is atomic so Poll() is one load. Everything else is guarded by the
// manager's mutex (ManagerImpl::mu_).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "connector/protocol.h"
#include "engine/plan.h"
#include "kvbridge/errors.h"
#include "kvbridge/kv_poll.h"

namespace kvbridge::internal {

// An optional value kept on the heap: one pointer in a room, which most
// requests never fill (a FailureRecord inline is 360 bytes, with 10,000 rooms
// in flight 3.6 MB). Reads like std::optional at the call sites.
template <typename T>
class BoxedOptional {
 public:
  BoxedOptional() = default;
  BoxedOptional& operator=(const T& v) {
    value_ = std::make_unique<T>(v);
    return *this;
  }
  BoxedOptional& operator=(T&& v) {
    value_ = std::make_unique<T>(std::move(v));
    return *this;
  }
  BoxedOptional& operator=(std::nullopt_t) {
    value_.reset();
    return *this;
  }
  explicit operator bool() const { return value_ != nullptr; }
  bool has_value() const { return value_ != nullptr; }
  const T& operator*() const { return *value_; }
  T& operator*() { return *value_; }
  const T* operator->() const { return value_.get(); }
  T* operator->() { return value_.get(); }
  void reset() { value_.reset(); }

 private:
  std::unique_ptr<T> value_;
};

// A value of a peer's that every room reading from the peer holds: one
// immutable copy per peer, shared, instead of one per room (with 10,000 rooms
// in flight, a key is 64 bytes and a RankId 136 plus its boot id on the heap
// per room). Reads as the value it holds; a default one as T's default.
template <typename T>
class Shared {
 public:
  Shared() = default;
  explicit Shared(T value) : value_(std::make_shared<const T>(std::move(value))) {}
  const T& get() const {
    static const T kNone{};
    return value_ ? *value_ : kNone;
  }
  operator const T&() const { return get(); }  // NOLINT: reads as the value
  const T* operator->() const { return &get(); }

 private:
  std::shared_ptr<const T> value_;
};

// A peer's key (Peer::shared_key).
class SharedKey : public Shared<std::string> {
 public:
  using Shared::Shared;
  const std::string& str() const { return get(); }
  friend bool operator==(const SharedKey& a, const std::string& b) { return a.str() == b; }
  friend bool operator==(const SharedKey& a, const SharedKey& b) { return a.str() == b.str(); }
};

// Prefill: one decode rank this request writes to (or only reports to).
struct SenderFlow {
  std::string peer_key;
  RankId decode;
  MetaMsg meta;
  std::optional<HeadSlice> slice;  // none: dummy (nothing to write)
  // The lowest prefill rank feeding this decode rank writes the state
  // buffers that move whole (on every stage: PlanState's StateShare), and
  // on the last stage that decode rank reads (LastStageRead, set when the
  // flow is shaped) the aux row too; that stage also sends the state not
  // paired by layer id.
  bool carries_state = false;
  bool last_stage_read = false;
  uint32_t next_chunk = 0;
  int inflight = 0;  // chunks posted, not completed
  // Its writes go where decode cannot revoke them (a same-host peer given
  // no grant: shared memory, cross-memory attach); a rejoin waits for them.
  bool unrevocable = false;
  bool quiesce_reply = false;  // decode asked; answer once inflight == 0
  bool told = false;           // decode knows this request failed
  bool closed = false;         // nothing more will be sent to decode
  // The last chunk's notice. It leaves only once every write of this flow
  // completed and only while the request has not failed: decode takes
  // Success from it, so it must never follow a failure after which the
  // application may have reused the source pages those writes read.
  std::optional<NotifyMsg> final_note;
};

struct SenderRoom {
  // `now`, `wall`: the manager's Clock when the request was created.
  SenderRoom(uint64_t r, SteadyTime now, WallTime wall)
      : room(r), created(now), created_wall(wall), phase_since(now) {}
  const uint64_t room;
  const SteadyTime created;
  // Wall time, compared with a record's detected_at from another rank: a
  // room record names this request only if it was detected after this
  // use of the room id began.
  const WallTime created_wall;
  std::atomic<int> state{static_cast<int>(KVPoll::kBootstrapping)};
  // Pages of the request decode already holds (its decode_prefix_len /
  // page_size), from the first metadata; -1 before any arrived.
  std::atomic<int64_t> decode_prefix_pages{-1};
  // Steady-clock ns (0: not yet) for KVSender::Timing(): metadata from every
  // decode rank arrived, the first write was posted, the last one completed.
  std::atomic<int64_t> metadata_done_ns{0};
  std::atomic<int64_t> first_write_ns{0};
  std::atomic<int64_t> writes_done_ns{0};
  // Guarded by ManagerImpl::mu_.
  bool live = true;            // KVSender not destroyed
  bool change_listed = false;  // in RoomChanges' list, not yet taken
  bool initialized = false;
  int64_t num_pages = -1;
  int64_t aux_index = -1;
  int64_t pages_sent = 0;
  bool last_posted = false;
  // A prefill rank of cp rank > 0 (sglang's is_dummy_cp_rank): decode reads
  // every request from cp rank 0 only, so this sender waits for no
  // metadata, says WaitingForInput until its last chunk, sends nothing and
  // succeeds on that chunk.
  bool cp_dummy = false;
  // A dead rank's record blocked this request when it was created; the
  // registry check numbered so (ManagerImpl::SettleRestartChecks) fails it
  // unless that rank has restarted. 0: none pending.
  uint64_t restart_check = 0;
  int decode_tp_size = 0;            // learned from the first metadata
  std::vector<int> expected_decode;  // decode tp ranks that must send metadata
  std::map<int, SenderFlow> flows;   // by decode tp rank
  // Decode generations this request is known to be (from an abort that
  // came before the sender): a newer one from that rank is a new request.
  std::map<int, uint64_t> aborted_generations;
  int inflight = 0;
  BoxedOptional<FailureRecord> failure;
  Phase phase = Phase::kWaitingForMetadata;
  SteadyTime phase_since;

  KVPoll poll() const { return static_cast<KVPoll>(state.load(std::memory_order_acquire)); }
};

// Decode: one prefill rank this request reads from.
struct ReceiverSource {
  SharedKey peer_key;
  Shared<RankId> prefill;  // the connected rank (Peer::id, shared)
  bool dummy = false;
  bool meta_sent = false;
  uint64_t session = 0;  // Peer::session the metadata went to (0: none went)
  uint32_t next_chunk = 0;
  bool last_received = false;
  bool told = false;  // this prefill rank knows the request failed
  // It said nothing more is in flight for the request (Quiesced, or a
  // RoomFailed that says so): a fact for the write rule.
  bool said_quiesced = false;
  // No write of it can land any more: set only on the write rule's word
  // (ManagerImpl::SettleSourceLocked, FenceRound), never undone.
  bool quiesced = false;
};

struct ReceiverRoom {
  ReceiverRoom(uint64_t r, uint64_t g, SteadyTime now, WallTime wall)
      : room(r), generation(g), created(now), created_wall(wall), phase_since(now) {}
  const uint64_t room;
  const uint64_t generation;
  const SteadyTime created;     // see SenderRoom
  const WallTime created_wall;  // see SenderRoom
  std::atomic<int> state{static_cast<int>(KVPoll::kBootstrapping)};
  std::atomic<bool> quiesced{false};
  // What Poll() said just before the room failed, and when (steady clock, ns;
  // 0 while not failed): KVReceiver::PollSettled() keeps saying the former
  // until the room is quiesced. Both are stored before `state` turns Failed.
  std::atomic<int> state_before_failure{static_cast<int>(KVPoll::kBootstrapping)};
  std::atomic<int64_t> failed_at_ns{0};
  // Guarded by ManagerImpl::mu_.
  bool live = true;
  bool change_listed = false;  // in RoomChanges' list, not yet taken
  bool initialized = false;
  bool unsettled_warned = false;  // logged that quiesce_timeout passed unquiesced
  bool resolved = false;          // sources known and connected
  uint64_t restart_check = 0;     // see SenderRoom
  int prefill_dp_rank = 0;
  // SendMetadata's message, held until it has gone to the sources (then
  // freed: nothing reads it again, and 10,000 rooms in flight each held
  // ~150 B of it); `meta_given` says SendMetadata was accepted.
  BoxedOptional<MetaMsg> meta;
  bool meta_given = false;
  std::vector<ReceiverSource> sources;
  BoxedOptional<FailureRecord> failure;
  Phase phase = Phase::kBootstrapping;
  SteadyTime phase_since;
  SteadyTime meta_sent_at{};
  // Why the last lookup of its sources failed (none while they went well),
  // and the prefill rank that did not answer it (its own endpoint, with
  // sglang's server, or its transport address), when it was not the registry:
  // whom the bootstrap deadline names.
  struct ResolveError {
    Status why;
    std::optional<RankId> unanswered;
  };
  BoxedOptional<ResolveError> last_resolve_error;

  KVPoll poll() const { return static_cast<KVPoll>(state.load(std::memory_order_acquire)); }
};

// The one way a room's Poll() answer changes, and the list of rooms whose
// answer changed (KVManager::TakeChangedRooms, with
// ManagerOptions::list_room_changes): an application with thousands of
// requests in flight polls those instead of every request each step. A room
// is listed once until taken, so the list holds at most one entry per room
// that changed, plus rooms released or replaced since (dropped or harmless
// when taken). Guarded by ManagerImpl::mu_, like the rooms.
class RoomChanges {
 public:
  explicit RoomChanges(bool listing) : listing_(listing) {}
  bool listing() const { return listing_; }
  template <typename Room>
  void Set(Room& room, KVPoll next) {
    if (room.poll() == next) return;
    room.state.store(static_cast<int>(next), std::memory_order_release);
    if (!listing_ || room.change_listed) return;
    room.change_listed = true;
    rooms_.push_back(room.room);
  }
  // The rooms listed since the last call, in the order they changed; the
  // caller clears each live room's change_listed.
  std::vector<uint64_t> Take() { return std::exchange(rooms_, {}); }

 private:
  const bool listing_;
  std::vector<uint64_t> rooms_;
};

}  // namespace kvbridge::internal
