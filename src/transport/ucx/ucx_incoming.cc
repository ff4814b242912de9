// The target side of the UCX data path: admitting incoming data AMs (the
// write capability and the per-sender bound), placing them, acknowledging
// batches, and taking ACKs as a sender. See ucx_transport_impl.h.
#include <algorithm>
#include <cstring>

#include "common/log.h"
#include "transport/ucx/ucx_transport_impl.h"

namespace kvbridge::internal::ucx {
namespace {

// More AMs in one batch than any sender posts; bounds `expected`.
constexpr uint64_t kMaxBlocksPerBatch = uint64_t{1} << 24;
// Revoked tokens remembered per region, to tell a revoked grant from a bad
// token in counters and messages (both are refused).
constexpr size_t kRevokedKept = 256;

bool InRange(uint64_t offset, uint64_t length, uint64_t size) {
  return length > 0 && offset <= size && length <= size - offset;
}

// A rendezvous receive at the target; completes one block of a batch.
struct Receive {
  UcxTransport* transport;
  std::pair<uint64_t, uint64_t> key;  // (connection, batch)
  uint64_t length;
  GrantId grant;                  // 0: the region's own token
  std::vector<ucp_dt_iov_t> iov;  // a gathered AM's destinations
};

// Why the pieces of a data AM into a region of `region_length` bytes are
// refused, or "": each inside the region, their total the header's length
// and the payload's. Each is checked before it is added: no sum can wrap.
std::string CheckPieces(std::span<const GatherPiece> pieces, uint64_t region_length,
                        const DataHeader& h, size_t length) {
  uint64_t total = 0;
  for (const GatherPiece& piece : pieces) {
    if (!InRange(piece.offset, piece.length, region_length))
      return "range [" + std::to_string(piece.offset) + ", +" + std::to_string(piece.length) +
             ") outside region " + std::to_string(h.region_id);
    total += piece.length;
  }
  if (total == length && h.length == length) return "";
  return std::to_string(pieces.size()) + " pieces of " + std::to_string(total) +
         " bytes in all, header " + std::to_string(h.length) + ", for a payload of " +
         std::to_string(length) + " bytes";
}

// A gathered AM's pieces: the header's bytes after the DataHeader, whole
// pieces, 1..kMaxGatherPieces of them. False for any other length.
bool ReadPieces(const void* header, size_t header_length, std::vector<GatherPiece>* pieces) {
  const size_t rest = header_length - sizeof(DataHeader);
  if (header_length <= sizeof(DataHeader) || rest % sizeof(GatherPiece) != 0 ||
      rest / sizeof(GatherPiece) > kMaxGatherPieces)
    return false;
  pieces->resize(rest / sizeof(GatherPiece));
  std::memcpy(pieces->data(), static_cast<const uint8_t*>(header) + sizeof(DataHeader), rest);
  return true;
}

void ReceiveDone(void* request, ucs_status_t status, size_t, void* user_data) {
  std::unique_ptr<Receive> rx(static_cast<Receive*>(user_data));
  ucp_request_free(request);
  Status st;
  if (status != UCS_OK) {
    st = FromUcs(status, "receive of " + std::to_string(rx->length) + " bytes");
  }
  if (rx->grant != 0) rx->transport->OnGrantReceiveDone(rx->grant);
  rx->transport->OnBlockDone(rx->key, st, /*lost=*/status != UCS_OK);
}

// An ACK on its way back: header and message live until the send completes.
struct AckSend {
  AckHeader header;
  std::string message;
};

void AckDone(void* request, ucs_status_t status, void* user_data) {
  std::unique_ptr<AckSend> ack(static_cast<AckSend*>(user_data));
  ucp_request_free(request);
  if (status != UCS_OK && status != UCS_ERR_CANCELED) {
    KVB_LOG_WARN("ucx transport: ACK of batch {} not sent: {}", ack->header.batch,
                 ucs_status_string(status));
  }
}

}  // namespace

std::string UcxTransport::WireTo(PeerId peer_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto peer = FindPeerLocked(peer_id);
  return peer ? peer->wire : std::string();
}

IncomingStats UcxTransport::Stats() {
  IncomingStats out;
  RunSync([&] {
    out = incoming_stats_;
    out.lingering = lingering_.size();
  });
  return out;
}

void UcxTransport::LogOncePerPeer(ucp_ep_h ep, bool IncomingPeer::*flag, const std::string& what) {
  IncomingPeer& p = incoming_peers_[ep];
  if (p.*flag) return;
  p.*flag = true;
  KVB_LOG_WARN("ucx transport {}: {} (logged once per sender endpoint)", options_.name, what);
}

Result<std::string> UcxTransport::GrantRegion(RegionId region, GrantId grant, GrantReach reach) {
  if (grant == 0) return InvalidArgumentError("GrantRegion: grant id 0 is reserved");
  KVB_ASSIGN_OR_RETURN(RegionToken token, NewRegionToken());
  RemoteKeyBlob blob;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(region);
    if (it == regions_.end()) {
      return NotFoundError("GrantRegion: unknown region " + std::to_string(region));
    }
    it->second->grants.emplace_back(grant, token);
    blob.base = reinterpret_cast<uint64_t>(it->second->addr);
    blob.length = it->second->length;
    blob.kind = it->second->kind;
  }
  // No packed rkey: off this host the holder can only send data AMs, each
  // of which this side admits (or, once revoked, refuses). A same-host
  // mapping grant also names the exporter, which hands the memory over for
  // this grant's token alone, until it is revoked.
  if (reach == GrantReach::kSameHostMapping && exporter_ && blob.kind == MemoryKind::kDram) {
    Status added = exporter_->AddGrant(region, grant, token);
    if (added.ok()) {
      blob.same_host_socket = exporter_->name();
    } else if (added.code() != StatusCode::kNotFound) {  // not exported: active messages only
      // Refused: the token given to no one is not kept for admission either.
      std::lock_guard<std::mutex> lock(mu_);
      auto it = regions_.find(region);
      if (it != regions_.end())
        std::erase_if(it->second->grants, [&](const auto& g) { return g.first == grant; });
      return added.WithContext("GrantRegion");
    }
  }
  blob.owner = ThisHost();
  blob.region_id = region;
  blob.token = token;
  return EncodeRemoteKey(blob);
}

Status UcxTransport::RevokeGrant(GrantId grant) {
  if (grant == 0) return InvalidArgumentError("RevokeGrant: grant id 0 is reserved");
  size_t removed = 0;
  if (exporter_) exporter_->RevokeGrant(grant);  // no new same-host mapping under it
  // On the progress thread, which admits every data AM: none is admitted
  // under the grant after this closure.
  RunSync([&] {
    std::lock_guard<std::mutex> lock(mu_);
    removed = revoked_grants_.count(grant);
    revoked_grants_.insert(grant);
    for (auto& [id, region] : regions_) {
      for (auto it = region->grants.begin(); it != region->grants.end();) {
        if (it->first != grant) {
          ++it;
          continue;
        }
        region->revoked.push_back(it->second);
        if (region->revoked.size() > kRevokedKept) region->revoked.pop_front();
        it = region->grants.erase(it);
        ++removed;
      }
    }
  });
  std::unique_lock<std::mutex> lock(mu_);
  if (removed == 0) {
    revoked_grants_.erase(grant);
    return NotFoundError("RevokeGrant: unknown grant " + std::to_string(grant));
  }
  auto landing = [&] {
    auto it = grant_receives_.find(grant);
    return it == grant_receives_.end() ? uint64_t{0} : it->second;
  };
  if (landing() != 0 && OnProgressThread()) {
    return FailedPreconditionError("RevokeGrant(" + std::to_string(grant) +
                                   ") on the progress thread with " + std::to_string(landing()) +
                                   " receives landing");
  }
  if (!grant_cv_.wait_for(lock, options_.revoke_timeout, [&] { return landing() == 0; })) {
    return DeadlineExceededError(
        "RevokeGrant(" + std::to_string(grant) + "): " + std::to_string(landing()) +
        " receives admitted under it still " + "landing after " +
        std::to_string(options_.revoke_timeout.count()) + " ms; they may still write");
  }
  return Status::Ok();
}

void UcxTransport::OnGrantReceiveDone(GrantId grant) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = grant_receives_.find(grant);
    if (it != grant_receives_.end() && --it->second == 0) grant_receives_.erase(it);
  }
  grant_cv_.notify_all();
}

std::optional<GrantId> UcxTransport::MatchTokenLocked(const LocalRegion& region,
                                                      const RegionToken& token,
                                                      bool* revoked) const {
  // Every candidate is compared (constant time each), match or not.
  std::optional<GrantId> match;
  if (TokensEqual(region.token, token)) match = 0;
  for (const auto& [grant, t] : region.grants) {
    if (TokensEqual(t, token)) match = grant;
  }
  bool was_revoked = false;
  for (const RegionToken& t : region.revoked) was_revoked |= TokensEqual(t, token);
  *revoked = !match && was_revoked;
  return match;
}

bool UcxTransport::RefusedBatch(ucp_ep_h reply_ep, std::pair<uint64_t, uint64_t> key) const {
  auto peer = incoming_peers_.find(reply_ep);
  return peer != incoming_peers_.end() &&
         std::find(peer->second.refused.begin(), peer->second.refused.end(), key) !=
             peer->second.refused.end();
}

void UcxTransport::RefuseWithoutState(const DataHeader& h, ucp_ep_h reply_ep, bool revoked,
                                      bool unknown) {
  if (unknown) {
    auto& refused = incoming_peers_[reply_ep].refused;
    const std::pair<uint64_t, uint64_t> key{h.connection, h.batch};
    if (std::find(refused.begin(), refused.end(), key) == refused.end()) {
      refused.push_back(key);
      if (refused.size() > IncomingPeer::kRefusedBatches) refused.pop_front();
    }
  }
  ++incoming_stats_.rejected_token;
  if (revoked) ++incoming_stats_.rejected_revoked;
  const std::string why = revoked   ? "under a revoked grant"
                          : unknown ? "that does not exist"
                                    : "without its token";
  LogOncePerPeer(reply_ep, &IncomingPeer::logged_token,
                 "dropped a write into region " + std::to_string(h.region_id) + " " + why +
                     "; nothing written");
  // No such region is the transport's InvalidArgument (Transport::PostWrites).
  SendAck(reply_ep, h.connection, h.batch,
          Status(unknown ? StatusCode::kInvalidArgument : StatusCode::kPermissionDenied,
                 "target refused write into region " + std::to_string(h.region_id) + ": " +
                     (revoked   ? "its grant was revoked"
                      : unknown ? "no such region"
                                : "no valid token") +
                     "; nothing written"));
}

bool UcxTransport::AdmitDataAm(const DataHeader& h, std::span<const GatherPiece> pieces,
                               size_t length, ucp_ep_h reply_ep, uint8_t** base, ucp_mem_h* memh,
                               GrantId* grant) {
  const std::pair<uint64_t, uint64_t> key{h.connection, h.batch};
  std::string bad;
  bool token_ok = true;
  bool revoked = false;
  bool unknown = false;  // no such region
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(h.region_id);
    std::optional<GrantId> match;
    if (it != regions_.end()) match = MatchTokenLocked(*it->second, h.token, &revoked);
    if (it == regions_.end()) {
      unknown = true;
      bad = "unknown region " + std::to_string(h.region_id);
    } else if (!match) {
      token_ok = false;
    } else {
      bad = CheckPieces(pieces, it->second->length, h, length);
    }
    if (bad.empty() && token_ok && it != regions_.end()) {
      *base = it->second->addr;
      *memh = it->second->mem.get();
      *grant = *match;
    }
  }
  auto found = incoming_.find(key);
  if (token_ok && found != incoming_.end() && found->second.reply_ep != reply_ep) {
    token_ok = false;  // a block for another sender's batch
  }
  // A region that does not exist opens no batch (nobody holds its token):
  // only a batch opened under a token counts such a block, as failed. Nor
  // does a later block of a batch refused so (it could never complete).
  if (found == incoming_.end() && (unknown || RefusedBatch(reply_ep, key))) {
    unknown = true;
    token_ok = false;
  }
  // Refusals that keep no state: the sender learns from the ACK.
  if (!token_ok) {
    RefuseWithoutState(h, reply_ep, revoked, unknown);
    return false;
  }
  if (found == incoming_.end()) {
    IncomingPeer& peer = incoming_peers_[reply_ep];
    std::string refusal;
    if (h.blocks == 0 || h.blocks > kMaxBlocksPerBatch) {
      refusal = "batch of " + std::to_string(h.blocks) + " blocks (limit " +
                std::to_string(kMaxBlocksPerBatch) + ")";
    } else if (peer.open_batches >= options_.max_incoming_batches_per_peer) {
      refusal = std::to_string(peer.open_batches) +
                " incoming batches already open from this sender (limit "
                "max_incoming_batches_per_peer = " +
                std::to_string(options_.max_incoming_batches_per_peer) + ")";
    }
    if (!refusal.empty()) {
      ++incoming_stats_.rejected_limit;
      LogOncePerPeer(reply_ep, &IncomingPeer::logged_limit, "refused incoming writes: " + refusal);
      SendAck(reply_ep, h.connection, h.batch,
              ResourceExhaustedError("target refused write: " + refusal + "; nothing written"));
      return false;
    }
    ++peer.open_batches;
    ++incoming_stats_.open_batches;
    IncomingBatch& in = incoming_[key];
    in.expected = h.blocks;
    in.reply_ep = reply_ep;
  }
  if (!bad.empty()) {
    KVB_LOG_ERROR("ucx transport {}: rejected incoming write: {}", options_.name, bad);
    OnBlockDone(key, InvalidArgumentError("target rejected write: " + bad), /*lost=*/false);
    return false;
  }
  return true;
}

ucs_status_t UcxTransport::OnDataAm(const void* header, size_t header_length, void* data,
                                    size_t length, const ucp_am_recv_param_t* param) {
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  const ucp_ep_h reply_ep =
      (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0 ? param->reply_ep : nullptr;
  std::vector<GatherPiece> pieces;
  const bool gathered = header_length != sizeof(DataHeader);
  if ((gathered && !ReadPieces(header, header_length, &pieces)) || reply_ep == nullptr) {
    // Not one of our senders (they send a full header, token included, and
    // whole pieces, with a reply endpoint): nothing to acknowledge, nothing
    // written.
    ++incoming_stats_.rejected_token;
    LogOncePerPeer(reply_ep, &IncomingPeer::logged_token,
                   "dropped a write with a " + std::to_string(header_length) + "-byte header" +
                       (reply_ep == nullptr ? " and no reply endpoint" : "") +
                       " (not a data header: no token, or a broken piece table); nothing written");
    return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
  }
  DataHeader h;
  std::memcpy(&h, header, sizeof(h));
  if (!gathered) pieces.push_back(GatherPiece{h.offset, h.length});
  uint8_t* base = nullptr;
  ucp_mem_h memh = nullptr;
  GrantId grant = 0;
  if (!AdmitDataAm(h, pieces, length, reply_ep, &base, &memh, &grant)) {
    return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
  }
  if (gathered) {
    ++incoming_stats_.gathered;
    incoming_stats_.gathered_pieces += pieces.size();
  }
  const std::pair<uint64_t, uint64_t> key{h.connection, h.batch};
  if (!rndv) {
    const uint8_t* from = static_cast<const uint8_t*>(data);
    for (const GatherPiece& piece : pieces) {
      std::memcpy(base + piece.offset, from, piece.length);
      from += piece.length;
    }
    OnBlockDone(key, Status::Ok(), /*lost=*/false);
    return UCS_OK;
  }
  auto rx = std::make_unique<Receive>(Receive{this, key, length, grant, {}});
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv_am = ReceiveDone;
  p.user_data = rx.get();
  void* dst = base + pieces.front().offset;
  size_t count = length;
  if (gathered) {
    // Straight into the pages, as the plain form; the registration is of
    // one contiguous buffer, so none is named for the pieces.
    for (const GatherPiece& piece : pieces) rx->iov.push_back({base + piece.offset, piece.length});
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    p.datatype = ucp_dt_make_iov();
    dst = rx->iov.data();
    count = rx->iov.size();
  } else {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    p.memh = memh;
  }
  ucs_status_ptr_t req = ucp_am_recv_data_nbx(progressing_, data, dst, count, &p);
  if (UCS_PTR_IS_PTR(req)) {
    if (grant != 0) {
      // Landing until ReceiveDone: RevokeGrant waits for it.
      std::lock_guard<std::mutex> lock(mu_);
      ++grant_receives_[grant];
    }
    rx.release();  // ReceiveDone owns it and reports the block
  } else if (UCS_PTR_IS_ERR(req)) {
    KVB_LOG_ERROR("ucx transport {}: receive of {} bytes failed: {}", options_.name, length,
                  ucs_status_string(UCS_PTR_STATUS(req)));
    OnBlockDone(key, FromUcs(UCS_PTR_STATUS(req), "receive"), /*lost=*/true);
  } else {
    OnBlockDone(key, Status::Ok(), /*lost=*/false);  // placed at once
  }
  return UCS_INPROGRESS;
}

void UcxTransport::OnBlockDone(std::pair<uint64_t, uint64_t> key, const Status& st, bool lost) {
  auto it = incoming_.find(key);
  if (it == incoming_.end()) return;
  IncomingBatch& in = it->second;
  if (!st.ok() && in.error.ok()) in.error = st;
  in.lost |= lost;
  if (++in.done < in.expected) return;
  // Every block of the batch is in our memory (or was refused). The slot is
  // freed before the sender hears of it, so that a sender that reacts to
  // the ACK finds the bound already lowered.
  const IncomingBatch done = std::move(in);
  incoming_.erase(it);
  --incoming_stats_.open_batches;
  auto peer = incoming_peers_.find(done.reply_ep);
  if (peer != incoming_peers_.end()) {
    --peer->second.open_batches;
    if (peer->second.open_batches == 0 && !peer->second.logged_token &&
        !peer->second.logged_limit) {
      incoming_peers_.erase(peer);
    }
  }
  // A failed receive means a broken link: the sender sees that.
  if (!done.lost) SendAck(done.reply_ep, key.first, key.second, done.error);
}

void UcxTransport::SendAck(ucp_ep_h reply_ep, uint64_t connection, uint64_t batch,
                           const Status& st) {
  auto ack = std::make_unique<AckSend>();
  ack->header.connection = connection;
  ack->header.batch = batch;
  ack->header.code = static_cast<int32_t>(st.code());
  ack->message = st.message();
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = AckDone;
  p.user_data = ack.get();
  p.flags = UCP_AM_SEND_FLAG_EAGER;
  ucs_status_ptr_t req = ucp_am_send_nbx(reply_ep, kAmAck, &ack->header, sizeof(AckHeader),
                                         ack->message.data(), ack->message.size(), &p);
  if (UCS_PTR_IS_PTR(req)) {
    ack.release();  // AckDone owns it now
  } else if (UCS_PTR_IS_ERR(req)) {
    KVB_LOG_WARN("ucx transport {}: ACK of batch {} not sent: {}", options_.name, batch,
                 ucs_status_string(UCS_PTR_STATUS(req)));
  }
}

ucs_status_t UcxTransport::RefuseRendezvous(const char* what) {
  // Logged at the 1st, 2nd, 4th, 8th... of them: a flood costs no log flood.
  const uint64_t n = ++incoming_stats_.rejected_rendezvous;
  if ((n & (n - 1)) == 0)
    KVB_LOG_WARN(
        "ucx transport {}: refused a {} sent by rendezvous (ours travel eager), unread; "
        "{} so far",
        options_.name, what, n);
  return UCS_ERR_INVALID_PARAM;
}

ucs_status_t UcxTransport::OnAckAm(const void* header, size_t header_length, void* data,
                                   size_t length) {
  if (header_length != sizeof(AckHeader)) return UCS_OK;
  AckHeader h;
  std::memcpy(&h, header, sizeof(h));
  auto peer_it = peers_by_connection_.find(h.connection);
  if (peer_it == peers_by_connection_.end()) return UCS_OK;  // closed meanwhile
  std::shared_ptr<Peer> peer = peer_it->second;
  auto it = peer->inflight.find(h.batch);
  if (it == peer->inflight.end() || !it->second->awaiting_ack) return UCS_OK;
  Batch* batch = it->second.get();
  if (h.code != 0) {
    Status st(static_cast<StatusCode>(h.code), std::string(static_cast<const char*>(data), length));
    // The target's reason is more precise than the UCX status of a refused
    // rendezvous send.
    if (batch->error.ok() || batch->error.code() == st.code()) {
      batch->error = st.WithContext("write to " + peer->name);
    }
  }
  StopAwaitingAck(batch);
  return UCS_OK;
}

}  // namespace kvbridge::internal::ucx
