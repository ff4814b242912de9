// The transport interface: the narrow waist between the page-transfer engine
// and the wires (UCX, same-host shared memory, in-process loopback).
//
// Model: "write these byte ranges from my registered regions into the peer's
// registered regions, tell me when they are visible", "send this control
// message", "tell me when a peer fails".
//
// Identity: a transport has an opaque Address() blob. Connect(blob) returns a
// PeerId for *outgoing* traffic to that peer. Connections are one-directional:
// a peer that wants to answer connects back with our Address(). Messages carry
// no transport-level sender; the layers above put the sender in the payload.
//
// Ordering guarantee: a message passed to SendMessage(peer) is delivered to
// the peer's MessageHandler only after every write batch posted earlier to the
// same peer has completed and its bytes are visible in the target memory.
// Messages to one peer are delivered in the order they were sent.
//
// Threading and progress: every method is thread-safe. Each transport owns
// the threads that progress it; callers never have to "progress" anything.
// WriteCallback, MessageHandler and PeerFailureHandler run on a transport
// thread: they must not block for long; they may call PostWrites and
// SendMessage. Set the handlers before the first Connect.
//
// Failure: when a peer dies or becomes unreachable the PeerFailureHandler is
// called once for that PeerId with a Status (usually kUnavailable) naming the
// peer; every pending batch to it completes with that Status; later calls for
// that PeerId fail with kUnavailable without touching memory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/step_watch.h"
#include "kvbridge/memory.h"
#include "kvbridge/status.h"

namespace kvbridge::internal {

using PeerId = uint64_t;          // 0 is never a valid peer
using RegionId = uint64_t;        // a local registered region
using RemoteRegionId = uint64_t;  // a peer's region imported on a connection
using GrantId = uint64_t;         // a revocable write capability (caller-chosen, not 0)

// How bytes reach a peer's memory. Chosen per peer (and per imported region)
// at ImportRegion time, logged, and reported by the benchmarks.
enum class DataPath {
  kLoopback,           // in-process memcpy (tests)
  kSharedMemory,       // peer region is a mapped memfd: memcpy, one-sided
  kCrossMemoryAttach,  // process_vm_writev into the peer, one-sided
  kUcxRendezvous,      // UCX active message, rendezvous for large blocks
  kUcxPut,             // UCX one-sided put (real RMA lane)
};
std::string_view DataPathName(DataPath path);

struct RegisteredRegion {
  RegionId id = 0;
  // Self-describing, checksummed blob a peer passes to ImportRegion. Carries
  // the base address, length, memory kind, the region's write capability (a
  // random token every write must carry; give the blob only to peers that
  // may write the region), and whatever each path needs (UCX packed rkey,
  // where to ask the owner for same-host access). Nothing in it chooses a
  // process, fd or address to write into without the owner's confirmation.
  std::string remote_key;
};

// One contiguous write. Offsets are relative to the region bases.
struct WriteOp {
  RegionId local_region = 0;
  uint64_t local_offset = 0;
  RemoteRegionId remote_region = 0;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
};

using WriteCallback = std::function<void(const Status&)>;
using MessageHandler = std::function<void(std::string_view payload)>;
using PeerFailureHandler = std::function<void(PeerId peer, const Status& why)>;

class Transport {
 public:
  virtual ~Transport() = default;

  // Short name for logs: "ucx", "loopback", "fault(ucx)".
  virtual std::string_view Name() const = 0;
  // Opaque blob peers pass to Connect.
  virtual const std::string& Address() const = 0;

  virtual void SetMessageHandler(MessageHandler handler) = 0;
  virtual void SetPeerFailureHandler(PeerFailureHandler handler) = 0;
  // The step the thread that delivers messages and failures is in, and for
  // how long; nullopt when it is between steps or the transport has no
  // such thread. While it is stuck this rank hears nothing: its owner says
  // so, naming the step (ManagerImpl::WarnStuckDelivery).
  virtual std::optional<StepWatch::Busy> DeliveryBusy() const { return std::nullopt; }

  // Registers application memory (not copied, not owned). The caller keeps
  // it alive until DeregisterMemory. Errors: InvalidArgument (null/empty).
  virtual Result<RegisteredRegion> RegisterMemory(void* addr, size_t length, MemoryKind kind) = 0;
  // NotFound for an unknown id.
  virtual Status DeregisterMemory(RegionId id) = 0;

  // Per-peer write capabilities, the fence for a peer that may still be
  // writing (a partitioned host). GrantRegion returns a remote key for
  // `region` whose token (>= 128 random bits) belongs to `grant` alone; one
  // grant may cover several regions. What the key offers is `reach`:
  //  * kMediated: only the paths the owner admits on every write (UCX
  //    active messages): no packed rkey for one-sided puts, no same-host
  //    socket. RevokeGrant stops every write under it.
  //  * kSameHostMapping: also, to a writer on this host, the owner's own
  //    same-host grant of the memory (its memfd, or cross-memory attach),
  //    handed over only for this grant's token. A mapping once taken cannot
  //    be revoked: RevokeGrant then refuses new mappings and every mediated
  //    write, and the caller keeps the rule "wait for the writer's Quiesced
  //    or its exit" for what it mapped.
  // RevokeGrant(grant): every later write carrying one of the grant's tokens
  // is refused before a byte is placed (counted; its batch completes with
  // PermissionDenied at the writer), and the call returns OK only once no
  // write admitted under the grant is still landing. Revoking a revoked grant
  // waits again (a retry after DeadlineExceeded). Errors: InvalidArgument
  // (grant 0), NotFound (unknown region / grant), DeadlineExceeded (an
  // admitted write did not finish within the transport's bound: it may still
  // land; the caller must not reuse the memory on this answer),
  // FailedPrecondition (called on a transport thread while writes under the
  // grant are landing), Unimplemented (a transport without grants).
  enum class GrantReach { kMediated, kSameHostMapping };
  virtual Result<std::string> GrantRegion(RegionId region, GrantId grant, GrantReach reach) {
    return UnimplementedError(std::string(Name()) + " transport has no per-peer write grants");
  }
  virtual Status RevokeGrant(GrantId grant) {
    return UnimplementedError(std::string(Name()) + " transport has no per-peer write grants");
  }

  // Connects to a peer's Address(). Blocks until the connection exists (not
  // until the peer answers). A second Connect to the same address returns a
  // new PeerId (a restarted peer must never reuse a stale endpoint).
  // Errors: InvalidArgument (garbled blob), Unavailable.
  virtual Result<PeerId> Connect(std::string_view peer_address) = 0;
  // Like Connect, but the endpoint's messages travel over a network link even
  // to a peer on this host, never through a shared-memory queue: a process
  // that was killed while writing into a peer's queue can leave that queue
  // blocked for every later writer (UCX 1.13's sysv/posix FIFO), so a
  // handshake that got no answer is tried again this way. The data paths
  // are chosen as for Connect. Default (transports without such queues):
  // Connect.
  virtual Result<PeerId> ConnectOverNetwork(std::string_view peer_address) {
    return Connect(peer_address);
  }
  // An Address() whose every Connect is a ConnectOverNetwork: what a rank
  // gives a peer that should answer it over the network.
  virtual const std::string& NetworkAddress() const { return Address(); }
  // Imports a peer's region once; the remote key is unpacked and cached.
  // Errors: InvalidArgument (garbled or foreign blob), Unavailable, NotFound
  // (unknown peer).
  virtual Result<RemoteRegionId> ImportRegion(PeerId peer, std::string_view remote_key) = 0;
  // Path of the most recently imported region of `peer`.
  virtual Result<DataPath> PathTo(PeerId peer) const = 0;
  // The network transports that carry `peer`'s bulk data on a UCX path, as
  // UCX names them ("tcp", "rc_mlx5,ud_mlx5"), read from the endpoint's
  // lanes when a region was imported. Empty for the same-host paths, the
  // loopback transport, or when UCX did not say.
  virtual std::string WireTo(PeerId peer) const { return {}; }

  // Posts a batch of writes. Every op is validated first (regions known,
  // ranges inside them); on any invalid op the call returns InvalidArgument,
  // writes nothing and does not call `done`. Otherwise `done` is called
  // exactly once, with OK when every byte is visible at the target, or the
  // error that stopped the batch. Ops may be written concurrently and in
  // any order (the same-host path splits a batch across writer threads):
  // ops whose target ranges overlap, in one batch or in batches in flight
  // together, leave those bytes unspecified (and are a data race that
  // ThreadSanitizer reports); the connector never posts them (decode's
  // page lists hold no duplicate).
  virtual Status PostWrites(PeerId peer, std::vector<WriteOp> ops, WriteCallback done) = 0;

  // Sends a control message (see the ordering guarantee above). Returns
  // Unavailable for a failed peer, NotFound for an unknown one. Delivery is
  // asynchronous; a message to a peer that dies may be lost.
  virtual Status SendMessage(PeerId peer, std::string payload) = 0;

  // Like SendMessage, in order with the other messages to the peer, but not
  // held behind write batches: for a message about writes that have already
  // completed (a request's last notice), which must not wait for batches
  // posted since. The default falls back to SendMessage.
  virtual Status SendMessageUnfenced(PeerId peer, std::string payload) {
    return SendMessage(peer, std::move(payload));
  }

  // Like SendMessage but without the ordering guarantee: sent at once, not
  // queued behind earlier writes or messages to the peer. For liveness
  // traffic (heartbeats) that must not wait behind bulk data. The default
  // falls back to SendMessage.
  virtual Status SendUrgentMessage(PeerId peer, std::string payload) {
    return SendMessage(peer, std::move(payload));
  }

  // Closes the connection; pending batches complete with Aborted.
  virtual void Disconnect(PeerId peer) = 0;
};

}  // namespace kvbridge::internal
