// Fault-injecting wrapper: any Transport, plus controls a test flips to make
// writes fail, stall or arrive late, messages vanish, or a peer die.
//
// Without faults it is transparent: calls go straight to the inner transport
// on the caller's thread. With faults it keeps transport.h's contract:
//   - Every batch is validated first (local region and range, remote region
//     imported on that peer): InvalidArgument, nothing written, no callback.
//     The remote *range* is checked by the inner transport, which for a held,
//     delayed or failed batch only sees it later: an op past the end of a
//     remote region then completes `done` with InvalidArgument instead.
//   - Per-peer order holds: while a batch to a peer is held or delayed, later
//     batches and messages to that peer queue behind it, so a message is never
//     delivered before the writes posted earlier.
//   - When PostWrites/SendMessage return non-OK, `done` is never called;
//     otherwise exactly once, on a transport thread (this wrapper's worker or
//     the inner transport's), never the caller's.
// Faults decided at post time: FailWrites, DelayWrites, HoldWrites,
// DropMessages and HoldMessages apply to batches/messages posted while they
// are set.
//
// Thread safety: all methods (including the controls) are thread-safe. The
// inner transport must not hold its locks while running callbacks.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "transport/transport.h"

namespace kvbridge::internal {

// What the wrapper did, for assertions.
struct FaultCounters {
  uint64_t batches_forwarded = 0;   // handed to the inner transport
  uint64_t batches_failed = 0;      // completed with a FailWrites status, nothing written
  uint64_t batches_held = 0;        // posted while HoldWrites was on
  uint64_t batches_delayed = 0;     // posted while DelayWrites was on
  uint64_t batches_vanished = 0;    // completed with a VanishPeer status
  uint64_t messages_forwarded = 0;  // handed to the inner transport
  uint64_t messages_dropped = 0;    // by DropMessages, or queued to a peer that died
  uint64_t messages_held = 0;       // sent while HoldMessages was on
  uint64_t urgent_forwarded = 0;    // SendUrgentMessage handed to the inner transport
  uint64_t urgent_dropped = 0;      // by DropUrgentMessages
  uint64_t muted_dropped = 0;       // sent on an endpoint MuteNextConnects muted
  uint64_t peers_vanished = 0;
  uint64_t revokes_started = 0;   // RevokeGrant calls (HoldRevokes)
  uint64_t revokes_returned = 0;  // RevokeGrant calls the inner transport answered
  uint64_t revokes_failed = 0;    // answered DeadlineExceeded by FailRevokesOfGrantsSoFar
  uint64_t network_connects = 0;  // ConnectOverNetwork calls that connected
};

class FaultTransport final : public Transport {
 public:
  // FailWrites target meaning "every peer" (0 is never a valid PeerId).
  static constexpr PeerId kAllPeers = 0;

  // Preconditions: inner is not null. Takes over the inner failure handler.
  explicit FaultTransport(std::unique_ptr<Transport> inner);
  // Held and queued batches complete with Aborted, then the inner transport
  // is destroyed (its own pending batches complete as it decides).
  ~FaultTransport() override;

  // --- Transport ---
  std::string_view Name() const override { return name_; }
  const std::string& Address() const override { return inner_->Address(); }
  void SetMessageHandler(MessageHandler handler) override;
  void SetPeerFailureHandler(PeerFailureHandler handler) override;
  Result<RegisteredRegion> RegisterMemory(void* addr, size_t length, MemoryKind kind) override;
  Status DeregisterMemory(RegionId id) override;
  // Grants are the target's: forwarded (and noted for
  // FailRevokesOfGrantsSoFar).
  Result<std::string> GrantRegion(RegionId region, GrantId grant, GrantReach reach) override;
  Status RevokeGrant(GrantId grant) override;
  Result<PeerId> Connect(std::string_view peer_address) override;
  Result<PeerId> ConnectOverNetwork(std::string_view peer_address) override;
  const std::string& NetworkAddress() const override {
    return tagged_network_address_.empty() ? inner_->NetworkAddress() : tagged_network_address_;
  }
  // From now on NetworkAddress() is the inner one behind a tag that another
  // FaultTransport's Connect takes off, counting that connect in
  // network_connects like a ConnectOverNetwork (a test then sees which
  // address a peer connected back to). Only between FaultTransports.
  void TagNetworkAddress();
  Result<RemoteRegionId> ImportRegion(PeerId peer, std::string_view remote_key) override;
  Result<DataPath> PathTo(PeerId peer) const override;
  std::string WireTo(PeerId peer) const override { return inner_->WireTo(peer); }
  Status PostWrites(PeerId peer, std::vector<WriteOp> ops, WriteCallback done) override;
  Status SendMessage(PeerId peer, std::string payload) override;
  // Never queued behind held or delayed batches (heartbeats must flow while a
  // transfer stalls); dropped only by DropUrgentMessages.
  Status SendUrgentMessage(PeerId peer, std::string payload) override;
  void Disconnect(PeerId peer) override;

  // --- Controls ---
  // Batches to `peer` (or kAllPeers) complete with `why` and write nothing.
  // An OK `why` clears that setting. A per-peer setting wins over kAllPeers.
  void FailWrites(PeerId peer, Status why);
  // Batches are handed to the inner transport `delay` after they are posted.
  // Zero turns it off (batches already delayed keep their time).
  void DelayWrites(std::chrono::milliseconds delay);
  // Batches are held: neither written nor completed until ReleaseHeldWrites.
  void HoldWrites();
  // While on, Disconnect leaves the peer's held batches held, as a write on
  // its way (a copy through a mapping) outlives the endpoint: they complete
  // (Aborted, nothing written) at ReleaseHeldWrites and count in HeldBatches.
  void KeepHeldWritesPastDisconnect(bool keep);
  // Turns holding off and sends every held batch on, in order (held
  // messages stay held).
  void ReleaseHeldWrites();
  // Number of batches held right now.
  size_t HeldBatches() const;
  // Ordered messages (SendMessage) are accepted (OK) and discarded.
  void DropMessages(bool drop);
  // Ordered messages are held (accepted, not delivered) until
  // ReleaseHeldMessages: an answer that comes late. Batches and messages
  // to the same peer queue behind a held one; urgent messages flow.
  void HoldMessages();
  // Turns holding off and sends every held message on, in order.
  void ReleaseHeldMessages();
  // Number of messages held right now.
  size_t HeldMessages() const;
  // Copies of the messages held right now, by endpoint (oldest first), in
  // the order each endpoint sends them.
  std::vector<std::string> HeldMessagePayloads() const;
  // While on, RevokeGrant waits (as a revoke waits for a stopped writer's
  // admitted receives); off lets the waiting ones through. Also counts
  // revokes_started.
  void HoldRevokes(bool hold);
  // While on, RevokeGrant of a grant given before this call answers
  // DeadlineExceeded without revoking it (as a revoke that timed out
  // waiting for admitted receives); grants given later revoke as usual.
  void FailRevokesOfGrantsSoFar(bool fail);
  // Urgent messages (heartbeats) are accepted (OK) and discarded: the peer
  // looks unresponsive while its data path still works.
  void DropUrgentMessages(bool drop);
  // The next `n` endpoints that Connect opens are mute: every message sent
  // on them, ordered or urgent, is accepted (OK) and discarded, like an
  // endpoint stuck in wire-up. Endpoints opened later work.
  void MuteNextConnects(int n) { MuteConnects(0, n, 0); }
  // After the next `skip` endpoints that Connect opens (which work), the
  // `n` after them deliver their first `pass` ordered messages and are mute
  // from then on (urgent messages on them vanish from the start): an answer
  // lost after the first message of a handshake went through.
  void MuteConnects(int skip, int n, int pass);
  // Treats `peer` as dead: the failure handler is called once with
  // Unavailable naming it; queued batches complete with that Status, batches
  // already in the inner transport complete with it when the inner finishes
  // them; later calls for `peer` return Unavailable. Unknown peers: no-op.
  void VanishPeer(PeerId peer);
  FaultCounters counters() const;
  Transport& inner() { return *inner_; }

 private:
  static constexpr std::string_view kNetworkTag = "fault-transport-network:";
  std::string tagged_network_address_;
  // Both Connects: the endpoint is tracked (and muted when MuteConnects says).
  Result<PeerId> Connected(Result<PeerId> connected, bool over_network);
  struct Item {
    bool is_batch = true;
    std::vector<WriteOp> ops;
    WriteCallback done;
    std::string payload;
    Status fail;  // injected failure (batches)
    bool held = false;
    std::chrono::steady_clock::time_point not_before;
  };
  struct PeerInfo {
    bool muted = false;
    int pass = 0;  // ordered messages a muted endpoint still delivers
    bool failed = false;
    bool vanished = false;
    Status failure;
    std::deque<Item> queue;  // waiting behind a held or delayed batch
  };
  using Task = std::function<void()>;

  Status ValidateLocked(PeerId peer, const std::vector<WriteOp>& ops) const;
  Result<PeerInfo*> OpenPeerLocked(PeerId peer);
  WriteCallback Wrap(PeerId peer, WriteCallback done);
  // Completes the batches kept past Disconnect with `why` (on the worker).
  void FailOrphansLocked(const Status& why);
  // Moves a failed/closed peer's queue to tasks_ completing with `why`.
  void FailQueueLocked(PeerInfo& info, const Status& why);
  void OnInnerFailure(PeerId peer, const Status& why);
  void Run();
  // Forwards every ready queue head. Worker only.
  void Pump();
  bool HeadReadyLocked(const Item& item, std::chrono::steady_clock::time_point now) const;

  std::unique_ptr<Transport> inner_;
  const std::string name_;

  // Serialises hand-offs to the inner transport so per-peer order holds.
  // Lock order: forward_mu_ before mu_. No user callback runs under either.
  std::mutex forward_mu_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  PeerFailureHandler on_failure_;                // guarded by mu_
  std::map<PeerId, PeerInfo> peers_;             // guarded by mu_
  std::map<RegionId, uint64_t> regions_;         // guarded by mu_: length
  std::map<RemoteRegionId, PeerId> remote_;      // guarded by mu_
  std::map<PeerId, Status> fail_;                // guarded by mu_ (kAllPeers too)
  std::chrono::milliseconds delay_{0};           // guarded by mu_
  bool hold_messages_ = false;                   // guarded by mu_
  bool hold_ = false;                            // guarded by mu_
  bool drop_messages_ = false;                   // guarded by mu_
  bool hold_revokes_ = false;                    // guarded by mu_
  bool keep_held_ = false;                       // guarded by mu_
  std::vector<WriteCallback> orphans_;           // held past Disconnect; guarded by mu_
  std::set<GrantId> granted_, failing_revokes_;  // guarded by mu_
  bool drop_urgent_ = false;                     // guarded by mu_
  int skip_connects_ = 0;                        // guarded by mu_
  int mute_connects_ = 0;                        // guarded by mu_
  int mute_pass_ = 0;                            // guarded by mu_
  FaultCounters counters_;                       // guarded by mu_
  std::deque<Task> tasks_;                       // guarded by mu_: run by the worker
  bool stopping_ = false;                        // guarded by mu_
  std::thread worker_;
};

}  // namespace kvbridge::internal
