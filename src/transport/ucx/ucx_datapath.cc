// The data path of UcxTransport: batches, control messages, active-message
// handlers, peer failure and disconnect. See ucx_transport_impl.h for the
// ordering and failure contract.
#include <cstring>

#include "common/log.h"
#include "transport/shm/stream_copy.h"
#include "transport/ucx/ucx_transport_impl.h"

namespace kvbridge::internal::ucx {
namespace {

void SendDone(void* request, ucs_status_t status, void* user_data) {
  auto* batch = static_cast<Batch*>(user_data);
  batch->peer->transport->OnPartDone(batch, status);
  ucp_request_free(request);
}

void FlushDone(void* request, ucs_status_t status, void* user_data) {
  SendDone(request, status, user_data);
}

struct MessageSend {
  std::string payload;
  std::shared_ptr<Peer> peer;
  bool ordered = true;
};

void MessageDone(void* request, ucs_status_t status, void* user_data) {
  std::unique_ptr<MessageSend> msg(static_cast<MessageSend*>(user_data));
  ucp_request_free(request);
  if (status != UCS_OK && status != UCS_ERR_CANCELED) {
    msg->peer->transport->OnEpError(msg->peer.get(), status);
  }
  if (msg->ordered) msg->peer->transport->OnMessageSent(msg->peer);
}

bool InRange(uint64_t offset, uint64_t length, uint64_t size) {
  return length > 0 && offset <= size && length <= size - offset;
}

}  // namespace

Status UcxTransport::PostWrites(PeerId peer_id, std::vector<WriteOp> ops, WriteCallback done) {
  std::vector<ResolvedOp> resolved;
  resolved.reserve(ops.size());
  std::shared_ptr<Peer> peer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    peer = FindPeerLocked(peer_id);
    if (!peer) return NotFoundError("PostWrites: unknown peer " + std::to_string(peer_id));
    if (peer->dead) return UnavailableError(peer->terminal.message());
    for (size_t i = 0; i < ops.size(); ++i) {
      const WriteOp& op = ops[i];
      auto local = regions_.find(op.local_region);
      auto remote = peer->regions.find(op.remote_region);
      std::string bad;
      if (local == regions_.end()) {
        bad = "unknown local region " + std::to_string(op.local_region);
      } else if (!InRange(op.local_offset, op.length, local->second->length)) {
        bad = "local range [" + std::to_string(op.local_offset) + ", +" +
              std::to_string(op.length) + ") outside region of " +
              std::to_string(local->second->length) + " bytes";
      } else if (remote == peer->regions.end()) {
        bad = "remote region " + std::to_string(op.remote_region) + " not imported from " +
              peer->name;
      } else if (!InRange(op.remote_offset, op.length, remote->second->blob.length)) {
        bad = "remote range [" + std::to_string(op.remote_offset) + ", +" +
              std::to_string(op.length) + ") outside region of " +
              std::to_string(remote->second->blob.length) + " bytes";
      }
      if (!bad.empty()) {
        return InvalidArgumentError("PostWrites to " + peer->name + ": op " + std::to_string(i) +
                                    ": " + bad + "; nothing written");
      }
      resolved.push_back(ResolvedOp{local->second->addr + op.local_offset, op.length,
                                    local->second->mem.get(), remote->second, op.remote_offset});
    }
  }
  Post([this, peer, resolved = std::move(resolved), done = std::move(done)]() mutable {
    StartBatch(peer, std::move(resolved), std::move(done));
  });
  return Status::Ok();
}

void UcxTransport::StartBatch(const std::shared_ptr<Peer>& peer, std::vector<ResolvedOp> ops,
                              WriteCallback done) {
  auto owned = std::make_unique<Batch>();
  Batch* batch = owned.get();
  batch->peer = peer;
  batch->seq = peer->next_batch_seq++;
  batch->done = std::move(done);
  batch->outstanding = 1;  // held until every part has been started
  peer->inflight[batch->seq] = std::move(owned);
  ++active_batches_;
  if (!peer->dead) {
    std::vector<ResolvedOp> ucx_ops, local_ops;
    for (auto& op : ops) {
      bool same_host = op.region->path == DataPath::kSharedMemory ||
                       op.region->path == DataPath::kCrossMemoryAttach;
      (same_host ? local_ops : ucx_ops).push_back(std::move(op));
    }
    if (!ucx_ops.empty()) StartUcxOps(batch, std::move(ucx_ops));
    if (!local_ops.empty()) StartSameHostOps(batch, std::move(local_ops));
  }
  FinishPart(batch);
}

ucs_status_ptr_t UcxTransport::SendOp(Batch* batch, const ResolvedOp& op, uint64_t am_blocks) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FIELD_MEMH | UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = SendDone;
  p.user_data = batch;
  p.memh = op.local_memh;
  ucp_ep_h ep = batch->peer->ep.get();
  if (op.region->path == DataPath::kUcxPut) {
    p.flags = 0;
    return ucp_put_nbx(ep, op.src, op.length, op.region->blob.base + op.remote_offset,
                       op.region->rkey.get(), &p);
  }
  batch->headers.push_back(DataHeader{op.region->blob.region_id, op.remote_offset, op.length,
                                      batch->peer->connection, batch->seq, am_blocks,
                                      op.region->blob.token});
  // REPLY: the target acknowledges the batch on the endpoint this gives it.
  p.flags = UCP_AM_SEND_FLAG_REPLY |
            (op.length >= options_.rndv_threshold ? UCP_AM_SEND_FLAG_RNDV : UCP_AM_SEND_FLAG_EAGER);
  return ucp_am_send_nbx(ep, kAmData, &batch->headers.back(), sizeof(DataHeader), op.src, op.length,
                         &p);
}

void UcxTransport::Track(Batch* batch, ucs_status_ptr_t req) {
  if (req == nullptr) return;
  ++batch->outstanding;
  if (UCS_PTR_IS_ERR(req)) {
    // A block that never left cannot be acknowledged: stop waiting for it.
    StopAwaitingAck(batch);
    OnPartDone(batch, UCS_PTR_STATUS(req));
  }
}

void UcxTransport::StopAwaitingAck(Batch* batch) {
  if (!batch->awaiting_ack) return;
  batch->awaiting_ack = false;
  FinishPart(batch);
}

ucs_status_ptr_t UcxTransport::SendGather(Batch* batch, std::span<const ResolvedOp> ops,
                                          uint64_t am_blocks) {
  Batch::Gather& g = batch->gathers.emplace_back();
  const ImportedRegion& region = *ops.front().region;
  uint64_t total = 0;
  std::vector<GatherPiece> pieces;
  for (const ResolvedOp& op : ops) {
    pieces.push_back(GatherPiece{op.remote_offset, op.length});
    g.iov.push_back(ucp_dt_iov_t{const_cast<uint8_t*>(op.src), op.length});
    total += op.length;
  }
  const DataHeader h{region.blob.region_id,   0,          total,
                     batch->peer->connection, batch->seq, am_blocks,
                     region.blob.token};
  g.header.resize(sizeof(DataHeader) + pieces.size() * sizeof(GatherPiece));
  std::memcpy(g.header.data(), &h, sizeof(h));
  std::memcpy(g.header.data() + sizeof(h), pieces.data(), pieces.size() * sizeof(GatherPiece));
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_DATATYPE;
  p.cb.send = SendDone;
  p.user_data = batch;
  p.datatype = ucp_dt_make_iov();
  // Eager: over tcp a rendezvous of scattered pieces (an IOV) was measured
  // slower than one message per page (0.8 against 2.2 GB/s); an eager
  // message of up to gather_bytes, faster (2.5-2.6).
  p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
  return ucp_am_send_nbx(batch->peer->ep.get(), kAmData, g.header.data(), g.header.size(),
                         g.iov.data(), g.iov.size(), &p);
}

std::vector<size_t> UcxTransport::GroupForGather(const std::vector<ResolvedOp>& ops) const {
  std::vector<size_t> groups;
  size_t i = 0;
  while (i < ops.size()) {
    size_t n = 1;
    uint64_t bytes = ops[i].length;
    const bool gatherable =
        ops[i].region->gather && max_gather_pieces_ >= 2 && ops[i].length < options_.gather_bytes;
    while (gatherable && i + n < ops.size() && n < max_gather_pieces_ &&
           ops[i + n].region == ops[i].region &&
           bytes + ops[i + n].length <= options_.gather_bytes) {
      bytes += ops[i + n].length;
      ++n;
    }
    groups.push_back(n);
    i += n;
  }
  return groups;
}

void UcxTransport::StartUcxOps(Batch* batch, std::vector<ResolvedOp> ops) {
  batch->headers.reserve(ops.size());  // stable addresses: never reallocated
  const std::vector<size_t> groups = GroupForGather(ops);
  // Sender-side completion of an AM (even rendezvous, over tcp) does not
  // mean the target placed it: AM parts complete on the target's ACK, sent
  // when it has placed all `am_blocks` of the batch. See the header.
  uint64_t am_blocks = 0;
  size_t at = 0;
  for (size_t n : groups) {
    am_blocks += ops[at].region->path != DataPath::kUcxPut;
    at += n;
  }
  if (am_blocks > 0) {
    batch->awaiting_ack = true;
    ++batch->outstanding;
  }
  bool any_put = false;
  at = 0;
  for (size_t n : groups) {
    const ResolvedOp& op = ops[at];
    any_put |= op.region->path == DataPath::kUcxPut;
    Track(batch, n == 1 ? SendOp(batch, op, am_blocks)
                        : SendGather(batch, std::span(ops).subspan(at, n), am_blocks));
    at += n;
  }
  if (any_put) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = FlushDone;
    p.user_data = batch;
    Track(batch, ucp_ep_flush_nbx(batch->peer->ep.get(), &p));
  }
}

// Writes same-host ops (memcpy into the mapped segment, process_vm_writev);
// stops at the first op once the peer is dead. Any thread.
// Only into what the owner granted: its memfd's mapping, or the pid the
// kernel named for its socket (never a pid or fd from the wire).
// Shared segments are written with streaming stores (stream_copy.h): the
// writer never reads them back, and it saves the destination's
// read-for-ownership, a third of the copy's memory traffic.
Status UcxTransport::WriteSameHost(const Peer& peer, const std::vector<ResolvedOp>& ops) {
  std::vector<CmaSegment> cma;
  int cma_pid = 0;
  // Before the caller reports the part done, whatever the way out.
  struct Fence {
    ~Fence() { StreamFence(); }
  } fence;
  for (const auto& op : ops) {
    if (peer.dead) return Status::Ok();  // pending work of a failed peer is not done
    ImportedRegion& r = *op.region;
    if (r.path == DataPath::kSharedMemory) {
      StreamCopy(r.segment->data() + r.segment_offset + op.remote_offset, op.src, op.length);
      continue;
    }
    if (cma_pid != 0 && r.cma_pid != cma_pid) {
      KVB_RETURN_IF_ERROR(CrossMemoryWrite(cma_pid, cma));
      cma.clear();
    }
    cma_pid = r.cma_pid;
    cma.push_back(CmaSegment{op.src, r.blob.base + op.remote_offset, op.length});
  }
  if (cma.empty() || peer.dead) return Status::Ok();
  return CrossMemoryWrite(cma_pid, cma);
}

// Progress thread: the same-host part of batch `seq` finished with `st`.
void UcxTransport::FinishSameHostPart(const std::shared_ptr<Peer>& peer, uint64_t seq,
                                      const Status& st) {
  auto it = peer->inflight.find(seq);
  if (it == peer->inflight.end()) return;
  Batch* b = it->second.get();
  if (!st.ok()) {
    if (st.code() == StatusCode::kUnavailable) {
      MarkPeerFailed(peer.get(), UnavailableError("peer " + peer->name +
                                                  " failed: cross-memory write: " + st.message()));
    } else if (b->error.ok()) {
      b->error = st.WithContext("write to " + peer->name);
    }
  }
  FinishPart(b);
}

void UcxTransport::StartSameHostOps(Batch* batch, std::vector<ResolvedOp> ops) {
  std::shared_ptr<Peer> peer = batch->peer;
  uint64_t seq = batch->seq;
  uint64_t bytes = 0;
  for (const auto& op : ops) bytes += op.length;
  // Small batches are copied here, on the progress thread, without two
  // thread hops (to a writer and back); that stalls progress for at most a
  // few hundred microseconds. Batches over split_copy_bytes are split into
  // parts of about equal bytes copied at once: by every writer thread, and
  // by this thread too when the batch is small enough to copy inline.
  // Completion order does not matter: an ordered message waits for every
  // part of every batch before it.
  const bool inline_part = bytes <= options_.inline_copy_bytes;
  const size_t writers = static_cast<size_t>(std::max(1, options_.writer_threads));
  const size_t parts =
      bytes > options_.split_copy_bytes ? std::min(writers + (inline_part ? 1 : 0), ops.size()) : 1;
  const uint64_t per_part = (bytes + parts - 1) / parts;
  std::vector<std::vector<ResolvedOp>> split(1);
  uint64_t in_part = 0;
  for (auto& op : ops) {
    if (in_part >= per_part && split.size() < parts) {
      split.emplace_back();
      in_part = 0;
    }
    in_part += op.length;
    split.back().push_back(std::move(op));
  }
  batch->outstanding += static_cast<int>(split.size());
  for (size_t i = inline_part ? 1 : 0; i < split.size(); ++i) {
    PostToWriter([this, peer, seq, ops = std::move(split[i])] {
      Status st = WriteSameHost(*peer, ops);
      Post([this, peer, seq, st] { FinishSameHostPart(peer, seq, st); });
    });
  }
  if (inline_part) FinishSameHostPart(peer, seq, WriteSameHost(*peer, split[0]));
}

void UcxTransport::OnPartDone(Batch* batch, ucs_status_t status) {
  if (status != UCS_OK) {
    Peer* peer = batch->peer.get();
    if (batch->error.ok()) batch->error = FromUcs(status, "write to " + peer->name);
    // A request that failed for any reason but cancellation (our own close)
    // or the target's refusal means the endpoint is broken.
    if (status != UCS_ERR_CANCELED && status != UCS_ERR_INVALID_PARAM) {
      OnEpError(peer, status);
    }
  }
  FinishPart(batch);
}

void UcxTransport::FinishPart(Batch* batch) {
  if (--batch->outstanding > 0) return;
  std::shared_ptr<Peer> peer = batch->peer;
  auto it = peer->inflight.find(batch->seq);
  std::unique_ptr<Batch> owned = std::move(it->second);
  peer->inflight.erase(it);
  --active_batches_;
  Status st = owned->error;
  if (peer->dead) {
    std::lock_guard<std::mutex> lock(mu_);  // Disconnect sets `terminal` on a user thread
    st = peer->terminal;
  }
  if (!st.ok())
    KVB_LOG_DEBUG("ucx transport {}: batch to {}: {}", options_.name, peer->name, st.ToString());
  // User callbacks never run inside a UCX callback: they may call back into
  // the transport, even its blocking methods (which then run inline).
  if (owned->done) Post([done = std::move(owned->done), st] { done(st); });
  FlushMessages(peer);
}

Status UcxTransport::SendMessage(PeerId peer_id, std::string payload) {
  return EnqueueMessage(peer_id, std::move(payload), /*fenced=*/true);
}

Status UcxTransport::SendMessageUnfenced(PeerId peer_id, std::string payload) {
  return EnqueueMessage(peer_id, std::move(payload), /*fenced=*/false);
}

Status UcxTransport::EnqueueMessage(PeerId peer_id, std::string payload, bool fenced) {
  std::shared_ptr<Peer> peer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    peer = FindPeerLocked(peer_id);
    if (!peer) return NotFoundError("SendMessage: unknown peer " + std::to_string(peer_id));
    if (peer->dead) return UnavailableError(peer->terminal.message());
  }
  Post([this, peer, fenced, payload = std::move(payload)]() mutable {
    if (peer->dead) return;
    // Batch sequence numbers start at 1: after_seq 0 waits for none.
    const uint64_t after = fenced ? peer->next_batch_seq - 1 : 0;
    peer->messages.push_back(Peer::PendingMessage{after, std::move(payload)});
    FlushMessages(peer);
  });
  return Status::Ok();
}

Status UcxTransport::SendUrgentMessage(PeerId peer_id, std::string payload) {
  std::shared_ptr<Peer> peer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    peer = FindPeerLocked(peer_id);
    if (!peer) return NotFoundError("SendUrgentMessage: unknown peer " + std::to_string(peer_id));
    if (peer->dead) return UnavailableError(peer->terminal.message());
  }
  Post([this, peer, payload = std::move(payload)]() mutable {
    if (!peer->dead) SendNow(peer, std::move(payload), /*ordered=*/false);
  });
  return Status::Ok();
}

void UcxTransport::FlushMessages(const std::shared_ptr<Peer>& peer) {
  // One ordered message in flight per peer: UCX may pass a later eager AM
  // ahead of one waiting in its pending queue, so the next message leaves
  // only when the previous one has left.
  while (!peer->dead && !peer->messages.empty() && !peer->message_in_flight) {
    auto& front = peer->messages.front();
    if (!peer->inflight.empty() && peer->inflight.begin()->first <= front.after_seq) return;
    std::string payload = std::move(front.payload);
    peer->messages.pop_front();
    SendNow(peer, std::move(payload), /*ordered=*/true);
  }
}

void UcxTransport::OnMessageSent(const std::shared_ptr<Peer>& peer) {
  peer->message_in_flight = false;
  FlushMessages(peer);
}

void UcxTransport::SendNow(const std::shared_ptr<Peer>& peer_ptr, std::string payload,
                           bool ordered) {
  Peer& peer = *peer_ptr;
  auto msg = std::make_unique<MessageSend>();
  msg->payload = std::move(payload);
  msg->peer = peer_ptr;
  msg->ordered = ordered;
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = MessageDone;
  p.user_data = msg.get();
  // Eager keeps messages in order with each other and with eager data.
  p.flags = UCP_AM_SEND_FLAG_EAGER;
  ucs_status_ptr_t req = ucp_am_send_nbx(peer.ep.get(), kAmMessage, nullptr, 0, msg->payload.data(),
                                         msg->payload.size(), &p);
  if (UCS_PTR_IS_PTR(req)) {
    if (ordered) peer.message_in_flight = true;
    msg.release();  // MessageDone owns it now
  } else if (UCS_PTR_IS_ERR(req)) {
    OnEpError(&peer, UCS_PTR_STATUS(req));
  }
}

ucs_status_t UcxTransport::OnMessageAm(void* data, size_t length) {
  // Deferred like write callbacks; the command queue keeps messages in order
  // and after the eager data copied in earlier callbacks.
  Post(
      [this, payload = std::string(static_cast<const char*>(data), length)] {
        MessageHandler handler;
        {
          std::lock_guard<std::mutex> lock(mu_);
          handler = message_handler_;
        }
        if (handler) handler(payload);
      },
      "the handler of an arriving message");
  return UCS_OK;
}

void UcxTransport::OnEpError(Peer* peer, ucs_status_t status) {
  if (peer->dead) return;
  MarkPeerFailed(
      peer, UnavailableError("peer " + peer->name + " failed: UCX " + ucs_status_string(status)));
}

void UcxTransport::MarkPeerFailed(Peer* peer, const Status& why) {
  PeerFailureHandler handler;
  std::shared_ptr<Peer> self;
  PeerId id = 0;  // set by ConnectTo under mu_, maybe after the endpoint failed
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (peer->dead) return;
    peer->failed = true;
    peer->terminal = why;
    peer->dead = true;
    handler = failure_handler_;
    id = peer->id;
    self = FindPeerLocked(id);
  }
  KVB_LOG_ERROR("ucx transport {}: {} (peer id {}, opened {} ms before)", options_.name,
                why.ToString(), id,
                std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::steady_clock::now() - peer->opened)
                    .count());
  peer->messages.clear();
  // Closing from inside a UCX callback is not allowed: defer; the force
  // close makes UCX complete every outstanding request of the endpoint.
  if (self) {
    Post([this, self] {
      ClosePeer(self, /*force=*/true);
      CloseLingeringIfLast(self->host);
    });
  }
  if (handler) Post([handler, id, why] { handler(id, why); }, "a peer failure handler");
}

void UcxTransport::Disconnect(PeerId peer_id) {
  std::shared_ptr<Peer> peer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    peer = FindPeerLocked(peer_id);
    if (!peer) return;
    peers_.erase(peer_id);
    if (!peer->dead) {
      peer->terminal = AbortedError("disconnected from " + peer->name);
      peer->dead = true;
    }
  }
  KVB_LOG_INFO("ucx transport {}: disconnecting from {}", options_.name, peer->name);
  Post([this, peer] { LingerOrClose(peer); }, "closing an endpoint");
}

void UcxTransport::LingerOrClose(const std::shared_ptr<Peer>& peer) {
  bool others = false;
  bool failed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed = peer->failed;
    others = HasLiveEndpointToLocked(peer->host);
  }
  if (!others || failed) {
    ClosePeer(peer, failed);
    CloseLingeringIfLast(peer->host);
    return;
  }
  StopPeer(peer);
  size_t same = 0;
  for (const auto& l : lingering_) same += SameProcess(l->host, peer->host) ? 1 : 0;
  if (same >= kMaxLingering) {
    for (auto it = lingering_.begin(); it != lingering_.end(); ++it) {
      if (!SameProcess((*it)->host, peer->host)) continue;
      ClosePeer(*it, false);
      lingering_.erase(it);
      break;
    }
  }
  lingering_.push_back(peer);
}

bool UcxTransport::HasLiveEndpointToLocked(const HostIdentity& host) const {
  for (const auto& [id, p] : peers_)
    if (!p->dead && SameProcess(p->host, host)) return true;
  return false;
}

void UcxTransport::CloseLingeringIfLast(const HostIdentity& host) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (HasLiveEndpointToLocked(host)) return;
  }
  for (auto it = lingering_.begin(); it != lingering_.end();) {
    if (SameProcess((*it)->host, host)) {
      ClosePeer(*it, /*force=*/false);  // lingering: stopped, never failed
      it = lingering_.erase(it);
    } else {
      ++it;
    }
  }
}

void UcxTransport::ClosePeer(const std::shared_ptr<Peer>& peer, bool force) {
  StopPeer(peer);
  ucp_ep_h ep = peer->ep.Release();
  if (ep == nullptr) return;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t req = ucp_ep_close_nbx(ep, &p);
  if (UCS_PTR_IS_PTR(req)) closing_.push_back(Closing{req, peer});
}

void UcxTransport::StopPeer(const std::shared_ptr<Peer>& peer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!peer->dead) {
      peer->terminal = AbortedError("transport shut down; peer " + peer->name);
      peer->dead = true;
    }
    for (auto& [id, region] : peer->regions) region->rkey.reset();
  }
  peer->messages.clear();
  peers_by_connection_.erase(peer->connection);
  // No ACK will be taken from this peer any more: batches waiting for one
  // complete (with `terminal`) once their UCX requests have.
  std::vector<uint64_t> waiting;
  for (auto& [seq, batch] : peer->inflight) {
    if (batch->awaiting_ack) waiting.push_back(seq);
  }
  for (uint64_t seq : waiting) {
    auto it = peer->inflight.find(seq);
    if (it != peer->inflight.end()) StopAwaitingAck(it->second.get());
  }
}

void UcxTransport::SetMessageHandler(MessageHandler handler) {
  std::lock_guard<std::mutex> lock(mu_);
  message_handler_ = std::move(handler);
}

void UcxTransport::SetPeerFailureHandler(PeerFailureHandler handler) {
  std::lock_guard<std::mutex> lock(mu_);
  failure_handler_ = std::move(handler);
}

}  // namespace kvbridge::internal::ucx
