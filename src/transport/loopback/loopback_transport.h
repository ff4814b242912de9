// Loopback transport: every endpoint lives in this process, writes are memcpy.
//
// A LoopbackFabric is the "network": transports created on one fabric can
// Connect to each other's Address(). It exists so that the engine, control and
// connector layers can test ordering, completion, abort and peer-failure logic
// without UCX, fast and deterministically. Semantics follow transport.h
// exactly:
//   - PostWrites validates every op first (InvalidArgument, nothing written,
//     no callback). When PostWrites (or SendMessage) returns non-OK, `done` is
//     never called; when it returns OK, `done` is called exactly once.
//   - Each transport owns one worker thread. Writes (the memcpy), their
//     WriteCallbacks and message sends run there, in post order, so a message
//     is handed to the target only after every earlier batch to that peer is
//     visible. The target's MessageHandler runs on the target's worker.
//   - Destroying a transport is its peers' "death": every transport holding a
//     PeerId for it gets PeerFailureHandler(peer, Unavailable) once per PeerId,
//     pending batches to it complete with that same Status, later calls for
//     that PeerId return Unavailable. No write lands in a destroyed
//     transport's regions, or in a region after DeregisterMemory returned.
//   - SendUrgentMessage skips the sender's queue: it reaches the target
//     without waiting for earlier batches (and may overtake them).
//   - Disconnect: pending batches complete with Aborted, queued messages are
//     dropped, the PeerId becomes unknown (NotFound).
//   - Destroying a transport completes its own pending batches with Aborted
//     (on its worker) before the destructor returns.
// Memory of kind kVram is treated as host-addressable (tests only).
//
// Thread safety: all methods are thread-safe and may be called from
// callbacks, but a transport must not be destroyed from its own callbacks.
#pragma once

#include <memory>
#include <string>

#include "kvbridge/status.h"
#include "transport/transport.h"

namespace kvbridge::internal {

// The in-process "network" loopback endpoints register on. Create with
// std::make_shared; transports keep it alive.
class LoopbackFabric {
 public:
  LoopbackFabric();
  ~LoopbackFabric();
  LoopbackFabric(const LoopbackFabric&) = delete;
  LoopbackFabric& operator=(const LoopbackFabric&) = delete;

  // Number of live transports on this fabric.
  size_t Size() const;

  struct State;  // defined in loopback_transport.cc

 private:
  friend class LoopbackTransport;
  std::unique_ptr<State> state_;
};

// Creates a transport registered on `fabric` as `name` (used in logs and
// error messages). Names are unique among live transports on a fabric; a
// name may be reused after its transport is destroyed, and the new transport
// gets a new Address() (a fresh incarnation), so stale PeerIds and address
// blobs of the old one never reach it.
// Errors: InvalidArgument (null fabric, empty name), AlreadyExists (a live
// transport has that name).
Result<std::unique_ptr<Transport>> CreateLoopbackTransport(std::shared_ptr<LoopbackFabric> fabric,
                                                           std::string name);

}  // namespace kvbridge::internal
