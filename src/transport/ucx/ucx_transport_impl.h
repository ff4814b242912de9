// UcxTransport: the Transport over UCX plus the same-host fast paths.
//
// Threads. One UCX context (RMA + AM + WAKEUP) and three workers (two that
// peers connect to: the usual one and net_worker_, for network-only
// endpoints; and out_worker_, which makes every endpoint of this side),
// owned by a progress thread that makes every UCX call. Other threads hand
// it closures through a mutex-protected queue and wake it with an eventfd;
// when idle it sleeps in poll() on that eventfd and the workers' event fds
// (armed), waking
// at least every keepalive interval so UCX keepalive runs. Blocking calls
// (RegisterMemory, Connect, ImportRegion, ...) wait for their closure; made
// on the progress thread itself (from a callback) they run inline. PostWrites
// and SendMessage only validate and enqueue, so callbacks may call them.
// Same-host writes (memcpy into a mapped peer segment, process_vm_writev)
// run on a separate writer thread so they never stall UCX progress, except
// batches of at most options.inline_copy_bytes, copied on the progress
// thread itself (no thread hop for a small request). There are
// options.writer_threads writers; a batch of more than
// options.split_copy_bytes is split into parts of about equal bytes copied
// at once, one per writer (plus one on the progress thread for a batch it
// copies inline), so a transfer uses more than one core's copy bandwidth.
//
// Paths, chosen per imported region at ImportRegion and logged at info:
// same host (SameHost of the declared identities) and
// options.same_host_paths: the writer asks the owner's same-host socket for
// a grant (same_host.h: the owner's pid from SO_PEERCRED, its region from
// its own table, its memfd by SCM_RIGHTS); kSharedMemory when the grant
// carries a segment, else kCrossMemoryAttach when process_vm_writev into the
// granted pid works, else UCX. A refused grant (pid or region not what the
// descriptor declares) refuses the import; an unreachable socket falls back
// to UCX.
// UCX: kUcxRendezvous (active messages: a DataHeader {region, offset,
// length} plus payload; blocks >= rndv_threshold use rendezvous and the
// target receives them straight into its region with ucp_am_recv_data_nbx,
// smaller ones are eager and copied in the callback; over a tcp lane,
// consecutive writes into one region travel as one eager AM whose header
// lists the pieces (ucx_blobs.h GatherPiece); the target validates every
// header and every piece against its registered regions and never writes
// outside them), or kUcxPut (ucp_put_nbx + ucp_ep_flush_nbx; options.force_put or
// KVBRIDGE_UCX_PATH=put) for hosts with a real RMA lane.
//
// Ordering, precisely. (1) A batch is complete when all its parts are:
// same-host parts when the writer thread has finished its memcpy /
// process_vm_writev (the bytes are then in the target's pages: one-sided);
// UCX put parts when ucp_ep_flush_nbx issued after the puts completes (remote
// completion); UCX AM parts when the target acknowledges them. Sender-side
// completion of an AM does not imply placement: with UCX 1.13 over tcp a
// rendezvous send was seen to complete while the target had not yet placed
// the data (the bench found the batch's last block missing, present ~1 s
// later). So every data AM is sent with UCP_AM_SEND_FLAG_REPLY and a
// DataHeader naming the batch (connection token, batch seq, number of AM
// blocks); the target counts the blocks as they are placed (eager: copied in
// the callback; rendezvous: when ucp_am_recv_data_nbx completes) or refused,
// and after the last one sends one kAmAck {connection, batch, StatusCode} on
// param->reply_ep, with the first refusal's message as payload. The sender's
// batch holds one extra part for that ACK; a refusal completes the batch with
// InvalidArgument (not a peer failure). One ACK per batch, not per block, so
// small eager blocks stay cheap; ACKs may arrive in any order (looked up by
// seq). A failed receive at the target sends no ACK (the link is broken; the
// sender sees that through its endpoint); a sender that stops taking ACKs
// (peer failed, Disconnect) completes the waiting batches with the peer's
// terminal Status once their UCX requests are done.
// (2) SendMessage records the sequence number of the last batch posted to the
// peer; the message waits in a per-peer FIFO until every batch up to that
// number has completed, and only one ordered message per peer is in flight at
// a time (UCX may let a later eager AM pass one still in its pending queue:
// observed on TCP under load). Messages are thus delivered in order, after
// the writes they follow. The target defers handlers through the same FIFO
// command queue, which keeps that order.
//
// Capabilities. Each registered region has a 128-bit random token, sent in
// its remote key; every data AM carries it (DataHeader::token) and the
// target compares it in constant time before it writes a byte. A wrong or
// missing token: dropped, counted (IncomingStats), logged once per sender
// endpoint, answered with a PermissionDenied ACK, never written. The target
// keeps at most options.max_incoming_batches_per_peer open incoming batches
// per sender endpoint (and blocks per batch are bounded): a block that would
// open one more is refused with a ResourceExhausted ACK, and no state grows.
// Per-peer grants (GrantRegion) add tokens to a region; their keys carry no
// rkey, so every write under one is a data AM this thread admits, except
// where a same-host mapping grant's writer took the memory from the
// exporter (which checks the grant's token). RevokeGrant withdraws the token
// from the exporter, drops it on this thread and waits until the rendezvous
// receives admitted under it (grant_receives_) finished.
//
// Failure. The endpoint's error callback (UCP_ERR_HANDLING_MODE_PEER, with
// keepalive), a failed UCX request, or ESRCH from process_vm_writev marks the
// peer failed once: Status Unavailable naming the peer's host and pid and the
// UCX status string; the PeerFailureHandler runs once; the endpoint is force-
// closed so UCX completes its outstanding requests; every batch pending then
// completes with that Status; queued messages are dropped. Disconnect closes
// the endpoint (flush close; force for failed peers) and pending batches
// complete with Aborted.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "transport/shm/same_host.h"
#include "transport/shm/shm.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_blobs.h"
#include "transport/ucx/ucx_handles.h"
#include "transport/ucx/ucx_transport.h"

namespace kvbridge::internal::ucx {

// Active message ids.
constexpr unsigned kAmData = 11;
constexpr unsigned kAmMessage = 12;
constexpr unsigned kAmAck = 13;

struct LocalRegion {
  RegionToken token;  // write capability, checked on every incoming AM
  // Per-peer capabilities (GrantRegion), and the last tokens revoked (at most
  // kRevokedKept, so that a refusal can say why; older ones read as unknown).
  std::vector<std::pair<GrantId, RegionToken>> grants;
  std::deque<RegionToken> revoked;
  uint8_t* addr = nullptr;
  size_t length = 0;
  MemoryKind kind = MemoryKind::kDram;
  UcpMem mem;
};

struct ImportedRegion {
  RemoteKeyBlob blob;
  DataPath path = DataPath::kUcxRendezvous;
  UcpRkey rkey;                              // progress thread only
  std::optional<MappedPeerSegment> segment;  // kSharedMemory, granted by the owner
  uint64_t segment_offset = 0;               // region start within `segment`
  int cma_pid = 0;                           // kCrossMemoryAttach: SO_PEERCRED pid
  // Writes into it travel gathered (UcxTransport::GroupForGather): active
  // messages whose bulk lane is tcp, where each message of a scattered page
  // costs a rendezvous round trip or an eager copy of its own. Over an RDMA
  // lane each page goes alone, by zero-copy rendezvous.
  bool gather = false;
};

struct Batch;

struct Peer {
  PeerId id = 0;
  HostIdentity host;
  std::string name;  // "host <h> pid <p>" for logs and errors
  class UcxTransport* transport = nullptr;
  // When ConnectTo made the endpoint (for the log line of its failure: one
  // that fails just after it opened points at UCX's pairing, not the peer).
  std::chrono::steady_clock::time_point opened;

  // Guarded by UcxTransport::mu_.
  std::map<RemoteRegionId, std::shared_ptr<ImportedRegion>> regions;
  std::optional<DataPath> last_path;
  std::string wire;  // WireTo: UCX transports of the bulk lanes
  bool failed = false;
  // Set once, before `dead` becomes true: the Status of every later batch.
  Status terminal;
  std::atomic<bool> dead{false};  // failed or disconnected; read by the writer

  // Progress thread only.
  UcpEp ep;
  uint64_t connection = 0;  // random token in DataHeader/AckHeader
  uint64_t next_batch_seq = 1;
  std::map<uint64_t, std::unique_ptr<Batch>> inflight;
  struct PendingMessage {
    uint64_t after_seq;
    std::string payload;
  };
  std::deque<PendingMessage> messages;
  bool message_in_flight = false;  // an ordered message not yet sent out
};

// One resolved write: source pointer and the place it goes.
struct ResolvedOp {
  const uint8_t* src = nullptr;
  uint64_t length = 0;
  ucp_mem_h local_memh = nullptr;
  std::shared_ptr<ImportedRegion> region;
  uint64_t remote_offset = 0;
};

struct Batch {
  std::shared_ptr<Peer> peer;
  uint64_t seq = 0;
  int outstanding = 0;  // parts not done; the awaited ACK counts as one
  Status error;
  WriteCallback done;
  std::vector<DataHeader> headers;  // stable storage for AM headers
  // A gathered AM's header and source pieces, kept until its send completes.
  struct Gather {
    std::vector<uint8_t> header;  // DataHeader, then the GatherPieces
    std::vector<ucp_dt_iov_t> iov;
  };
  std::deque<Gather> gathers;  // stable addresses
  bool awaiting_ack = false;   // has AM parts; the target's ACK is due
};

// Target side: a batch whose data AMs are arriving from one sender.
struct IncomingBatch {
  ucp_ep_h reply_ep = nullptr;  // the sender's endpoint (from its first block)
  uint64_t expected = 0;        // DataHeader::blocks
  uint64_t done = 0;            // placed, rejected or failed
  bool lost = false;            // a receive failed: no ACK (the link is broken)
  Status error;                 // first rejection, sent back in the ACK
};

// Target side, per sender endpoint: open incoming batches and what was
// logged about it.
struct IncomingPeer {
  size_t open_batches = 0;
  bool logged_token = false;
  bool logged_limit = false;
  // The latest batches (connection, batch) refused for naming no region
  // (at most kRefusedBatches): their later blocks are refused too, never
  // opening a batch that could not complete.
  static constexpr size_t kRefusedBatches = 64;
  std::deque<std::pair<uint64_t, uint64_t>> refused;
};

// Counters of the incoming data path (any thread).
struct IncomingStats {
  uint64_t rejected_token = 0;       // data AMs without the region's token
  uint64_t rejected_limit = 0;       // data AMs over the per-peer bound
  uint64_t rejected_revoked = 0;     // data AMs under a revoked grant (also in rejected_token)
  uint64_t open_batches = 0;         // incoming batches now open
  uint64_t gathered = 0;             // admitted data AMs that carried a piece table
  uint64_t gathered_pieces = 0;      // the pieces they carried
  uint64_t lingering = 0;            // disconnected endpoints not closed yet (LingerOrClose)
  uint64_t rejected_rendezvous = 0;  // messages and ACKs sent by rendezvous (ours are eager)
};

class UcxTransport final : public Transport {
 public:
  static Result<std::unique_ptr<Transport>> Create(const UcxTransportOptions& options);
  ~UcxTransport() override;

  std::string_view Name() const override { return "ucx"; }
  const std::string& Address() const override { return address_; }
  const std::string& NetworkAddress() const override { return network_address_; }
  void SetMessageHandler(MessageHandler handler) override;
  void SetPeerFailureHandler(PeerFailureHandler handler) override;
  Result<RegisteredRegion> RegisterMemory(void* addr, size_t length, MemoryKind kind) override;
  Status DeregisterMemory(RegionId id) override;
  Result<PeerId> Connect(std::string_view peer_address) override {
    return ConnectTo(peer_address, false);
  }
  Result<PeerId> ConnectOverNetwork(std::string_view peer_address) override {
    return ConnectTo(peer_address, true);
  }
  Result<RemoteRegionId> ImportRegion(PeerId peer, std::string_view remote_key) override;
  Result<DataPath> PathTo(PeerId peer) const override;
  Result<std::string> GrantRegion(RegionId region, GrantId grant, GrantReach reach) override;
  Status RevokeGrant(GrantId grant) override;
  std::string WireTo(PeerId peer) const override;
  std::optional<StepWatch::Busy> DeliveryBusy() const override {
    return step_.BusyAt(std::chrono::steady_clock::now());
  }
  Status PostWrites(PeerId peer, std::vector<WriteOp> ops, WriteCallback done) override;
  Status SendMessage(PeerId peer, std::string payload) override;
  Status SendMessageUnfenced(PeerId peer, std::string payload) override;
  Status SendUrgentMessage(PeerId peer, std::string payload) override;
  // Queues an ordered message; `fenced`: behind every batch posted so far.
  Status EnqueueMessage(PeerId peer, std::string payload, bool fenced);
  void Disconnect(PeerId peer) override;

  // Called from UCX callbacks (progress thread).
  void OnPartDone(Batch* batch, ucs_status_t status);
  void OnEpError(Peer* peer, ucs_status_t status);
  void OnMessageSent(const std::shared_ptr<Peer>& peer);
  ucs_status_t OnDataAm(const void* header, size_t header_length, void* data, size_t length,
                        const ucp_am_recv_param_t* param);
  ucs_status_t OnMessageAm(void* data, size_t length);
  // A message or ACK sent by rendezvous: counted, logged once, refused.
  ucs_status_t RefuseRendezvous(const char* what);
  ucs_status_t OnAckAm(const void* header, size_t header_length, void* data, size_t length);
  // Target side: one data AM of batch `key` was placed (ok), rejected
  // (error) or lost (its receive failed).
  void OnBlockDone(std::pair<uint64_t, uint64_t> key, const Status& st, bool lost);
  // A rendezvous receive admitted under `grant` (0: the region's own token)
  // has finished, placed or not.
  void OnGrantReceiveDone(GrantId grant);
  // Counters of the incoming data path, read on the progress thread: also a
  // barrier (everything the target did before the call has happened).
  // Thread-safe; not from a UCX callback.
  IncomingStats Stats();

  // Disconnected endpoints that may linger per process (LingerOrClose).
  static constexpr size_t kMaxLingering = 16;

 private:
  explicit UcxTransport(const UcxTransportOptions& options);
  Status Init();
  // Connect and ConnectOverNetwork: the peer's network-only worker address
  // when `network_only` (its full one if that cannot be reached).
  Result<PeerId> ConnectTo(std::string_view peer_address, bool network_only);

  // Queues `fn` for the progress thread; `what` (a literal) names it while
  // it runs (DeliveryBusy).
  void Post(std::function<void()> fn, const char* what = "a transport command");
  // Runs `fn` on the progress thread and waits (inline when already there).
  void RunSync(const std::function<void()>& fn);
  bool OnProgressThread() const { return std::this_thread::get_id() == progress_id_; }
  // Every worker has an event fd: the progress thread can sleep in poll().
  bool Wakeup() const { return worker_efd_ >= 0 && net_worker_efd_ >= 0 && out_worker_efd_ >= 0; }
  void ProgressLoop();
  bool RunCommands();
  void PollClosing();
  void WriterLoop();
  void PostToWriter(std::function<void()> fn);

  // Progress thread.
  void StartBatch(const std::shared_ptr<Peer>& peer, std::vector<ResolvedOp> ops,
                  WriteCallback done);
  void StartUcxOps(Batch* batch, std::vector<ResolvedOp> ops);
  ucs_status_ptr_t SendOp(Batch* batch, const ResolvedOp& op, uint64_t am_blocks);
  // One AM carrying ops [first, first + n) (n >= 2, one region).
  ucs_status_ptr_t SendGather(Batch* batch, std::span<const ResolvedOp> ops, uint64_t am_blocks);
  // The AM messages of `ops`: how many consecutive ops each carries.
  std::vector<size_t> GroupForGather(const std::vector<ResolvedOp>& ops) const;
  void Track(Batch* batch, ucs_status_ptr_t request);
  void StopAwaitingAck(Batch* batch);
  void SendAck(ucp_ep_h reply_ep, uint64_t connection, uint64_t batch, const Status& st);
  void StartSameHostOps(Batch* batch, std::vector<ResolvedOp> ops);
  Status WriteSameHost(const Peer& peer, const std::vector<ResolvedOp>& ops);
  void FinishSameHostPart(const std::shared_ptr<Peer>& peer, uint64_t seq, const Status& st);
  void FinishPart(Batch* batch);
  void FlushMessages(const std::shared_ptr<Peer>& peer);
  void SendNow(const std::shared_ptr<Peer>& peer, std::string payload, bool ordered);
  void MarkPeerFailed(Peer* peer, const Status& why);
  // Stops `peer` (its batches complete with its terminal Status, no ACK is
  // taken from it) and closes its endpoint.
  void ClosePeer(const std::shared_ptr<Peer>& peer, bool force);
  void StopPeer(const std::shared_ptr<Peer>& peer);
  // Disconnect's close. UCX paired the endpoints two workers opened to each
  // other: closing one of ours could close the one the other process wrote
  // to us over, and its write ACKs then went nowhere (seen after a handshake
  // sent again on a new endpoint: every transfer waited out its deadline).
  // So an endpoint stops at once but closes only with the last live one to
  // that process (or when it fails, or the transport goes); until then it
  // lingers, unused, at most kMaxLingering per process. Since out_worker_
  // makes our endpoints no such pairing happens; the lingering stays as a
  // second line (UcxPairingTest covers both).
  void LingerOrClose(const std::shared_ptr<Peer>& peer);
  // Closes the lingering endpoints to `host`'s process unless a live peer
  // to it remains.
  void CloseLingeringIfLast(const HostIdentity& host);
  // A peer to `host`'s process that is neither failed nor disconnected
  // (mu_ held).
  bool HasLiveEndpointToLocked(const HostIdentity& host) const;
  std::shared_ptr<Peer> FindPeerLocked(PeerId id) const;
  // The path for `region`; a refused same-host grant is an error.
  Result<DataPath> ChoosePath(const Peer& peer, ImportedRegion& region) const;
  // Target side: checks one data AM before anything is written: every
  // piece inside the region and the pieces' total the payload's length
  // (a plain AM is one piece); on a refusal answers the sender and returns
  // false. *base: the region's first byte.
  bool AdmitDataAm(const DataHeader& h, std::span<const GatherPiece> pieces, size_t length,
                   ucp_ep_h reply_ep, uint8_t** base, ucp_mem_h* memh, GrantId* grant);
  // A write refused by ACK, keeping no state (no valid token, a revoked
  // grant, no such region), logged once per sender.
  void RefuseWithoutState(const DataHeader& h, ucp_ep_h reply_ep, bool revoked, bool unknown);
  bool RefusedBatch(ucp_ep_h reply_ep, std::pair<uint64_t, uint64_t> key) const;
  // Which capability `token` is for `region`: 0 for the region's own token,
  // the grant's id, or nullopt (unknown; `*revoked` when it was revoked).
  std::optional<GrantId> MatchTokenLocked(const LocalRegion& region, const RegionToken& token,
                                          bool* revoked) const;
  // Logs `what` about sender `ep` once (per flag).
  void LogOncePerPeer(ucp_ep_h ep, bool IncomingPeer::*flag, const std::string& what);

  const UcxTransportOptions options_;
  bool force_put_ = false;
  UcpContext context_;
  UcpWorker worker_;
  // Endpoints over the network only (ConnectOverNetwork, and peers that
  // connect to network_address_) live on a worker of their own: UCX pairs
  // the k-th endpoint one worker makes to another with the k-th made back
  // (its wire-up matches them by sequence number) and UCX 1.13 aborts the
  // process when the two were made for different transports.
  UcpWorker net_worker_;
  // Where ConnectTo makes its endpoints to peers on other hosts (and to any
  // peer when UCX_TLS allows no shared memory). No peer has its address, so
  // no wire-up request reaches it and UCX never pairs one of our endpoints
  // with one the peer made to us: each pairs with an internal endpoint of
  // the worker it reached. Paired, closing either closed the other, and a
  // pairing is by sequence number: when the two sides had made different
  // numbers of endpoints to each other (a Hello sent twice), the endpoint
  // decode opened after a healed partition paired with one prefill had
  // closed during it, and died with it a second later ("Connection reset by
  // remote peer"): decode declared a live prefill failed. Endpoints that may
  // get shared-memory lanes (a peer on this host) stay on worker_ and
  // net_worker_, paired as before (lingering covers them): UCX 1.13 leaks a
  // peer's internal shared-memory endpoint to a process that was killed
  // (LeakSanitizer at exit in the demo's kill-prefill run, 7 runs in 35
  // with every endpoint here, none in 20 before).
  UcpWorker out_worker_;
  // The worker being progressed: the one an AM callback's data arrived on.
  ucp_worker_h progressing_ = nullptr;
  size_t max_gather_pieces_ = 0;  // < 2: no gathering
  std::string address_;
  std::string network_address_;  // its worker address is the network-only one
  int wake_fd_ = -1;
  int worker_efd_ = -1;  // -1: no wakeup support, poll with a short timeout
  int net_worker_efd_ = -1;
  int out_worker_efd_ = -1;
  std::thread progress_thread_;
  std::thread::id progress_id_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> progress_done_{false};

  mutable std::mutex mu_;
  struct Command {
    std::function<void()> fn;
    const char* what;
  };
  std::deque<Command> commands_;                              // GUARDED_BY(mu_)
  StepWatch step_;                                            // the progress thread's current step
  std::map<RegionId, std::unique_ptr<LocalRegion>> regions_;  // GUARDED_BY(mu_)
  std::map<PeerId, std::shared_ptr<Peer>> peers_;             // GUARDED_BY(mu_)
  RegionId next_region_id_ = 1;                               // GUARDED_BY(mu_)
  PeerId next_peer_id_ = 1;                                   // GUARDED_BY(mu_)
  RemoteRegionId next_remote_id_ = 1;                         // GUARDED_BY(mu_)
  MessageHandler message_handler_;                            // GUARDED_BY(mu_)
  PeerFailureHandler failure_handler_;                        // GUARDED_BY(mu_)
  // Rendezvous receives admitted under each grant and not yet finished;
  // RevokeGrant waits on grant_cv_ until its grant has none.
  std::map<GrantId, uint64_t> grant_receives_;  // GUARDED_BY(mu_)
  std::set<GrantId> revoked_grants_;            // GUARDED_BY(mu_): a repeat waits again
  std::condition_variable grant_cv_;

  // Progress thread only: endpoint close requests in flight.
  struct Closing {
    void* request;
    std::shared_ptr<Peer> peer;
  };
  std::vector<Closing> closing_;
  std::vector<std::shared_ptr<Peer>> lingering_;  // progress thread only (LingerOrClose)
  int active_batches_ = 0;                        // progress thread only
  // Progress thread only: our peers by connection token (for their ACKs),
  // and, as a target, the batches whose data AMs are arriving.
  std::map<uint64_t, std::shared_ptr<Peer>> peers_by_connection_;
  std::map<std::pair<uint64_t, uint64_t>, IncomingBatch> incoming_;
  std::map<ucp_ep_h, IncomingPeer> incoming_peers_;
  IncomingStats incoming_stats_;
  // Owner side of the same-host grants; null when same-host paths are off
  // or the socket could not be made (peers then use UCX).
  std::unique_ptr<SameHostExporter> exporter_;

  std::mutex writer_mu_;
  std::condition_variable writer_cv_;
  std::deque<std::function<void()>> writer_jobs_;  // GUARDED_BY(writer_mu_)
  bool writer_stop_ = false;                       // GUARDED_BY(writer_mu_)
  std::vector<std::thread> writer_threads_;
};

}  // namespace kvbridge::internal::ucx
