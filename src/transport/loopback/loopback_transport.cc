#include "transport/loopback/loopback_transport.h"

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "common/log.h"
#include "common/process.h"
#include "common/wire.h"
#include "transport/loopback/loopback_codec.h"

namespace kvbridge::internal {
namespace loopback_detail {

// Fabric ids and incarnations: unique within the process, never reused.
uint64_t NextUniqueId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

struct Region {
  uint8_t* addr = nullptr;
  size_t length = 0;
  std::vector<std::pair<GrantId, RegionToken>> grants;  // live per-peer tokens
};

struct Endpoint;

enum class PeerState { kOpen, kFailed, kClosed };

// One outgoing connection. Mutable fields are guarded by the owner's `mu`.
struct Peer {
  PeerId id = 0;
  std::shared_ptr<Endpoint> target;
  PeerState state = PeerState::kOpen;
  Status failure;  // set with kFailed
  // (target region, token) -> our id
  std::map<std::pair<RegionId, std::array<uint8_t, 16>>, RemoteRegionId> imported;
};

struct RemoteRegion {
  PeerId peer = 0;
  RegionId target_region = 0;
  uint64_t length = 0;
  RegionToken token;  // zero: the region's own key
};

// A validated op, resolved to region ids on both sides. Pointers are looked up
// again when the batch runs, so a region deregistered meanwhile is detected.
struct ResolvedOp {
  RegionId local_region = 0;
  uint64_t local_offset = 0;
  RegionId target_region = 0;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
  RegionToken token;
};

struct Endpoint {
  std::string name;
  uint64_t incarnation = 0;
  uint64_t fabric_id = 0;
  std::string address;

  // Regions peers write into. Writers hold region_mu for the whole memcpy,
  // so DeregisterMemory and destruction wait for copies in flight.
  std::mutex region_mu;
  bool dead = false;                   // guarded by region_mu
  std::map<RegionId, Region> regions;  // guarded by region_mu
  RegionId next_region = 1;            // guarded by region_mu
  std::set<GrantId> revoked_grants;    // guarded by region_mu
  std::atomic<bool> gone{false};       // fast path for `dead`

  // The worker's task queue.
  std::mutex queue_mu;
  std::condition_variable queue_cv;
  std::deque<std::function<void()>> tasks;  // guarded by queue_mu
  bool stopping = false;                    // guarded by queue_mu
  std::thread worker;

  // Connection state. Lock order: mu before any region_mu.
  std::mutex mu;
  bool shutting_down = false;                             // guarded by mu
  MessageHandler on_message;                              // guarded by mu
  PeerFailureHandler on_failure;                          // guarded by mu
  std::map<PeerId, std::shared_ptr<Peer>> peers;          // guarded by mu
  std::map<RemoteRegionId, RemoteRegion> remote_regions;  // guarded by mu
  PeerId next_peer = 1;                                   // guarded by mu
  RemoteRegionId next_remote = 1;                         // guarded by mu

  // False once the worker is stopping: the task is dropped.
  bool Enqueue(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(queue_mu);
      if (stopping) return false;
      tasks.push_back(std::move(task));
    }
    queue_cv.notify_one();
    return true;
  }

  // Worker body: runs tasks in order; after `stopping`, drains what is queued
  // (tasks see shutting_down and abort), then drops peers to break cycles.
  void Run() {
    NameThisThread("kvb-loopback");
    while (true) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(queue_mu);
        queue_cv.wait(lock, [&] { return stopping || !tasks.empty(); });
        if (tasks.empty()) break;
        task = std::move(tasks.front());
        tasks.pop_front();
      }
      task();
    }
    std::lock_guard<std::mutex> lock(mu);
    peers.clear();
    remote_regions.clear();
    on_message = nullptr;
    on_failure = nullptr;
  }

  Status GoneStatus(const Peer& peer) const {
    return UnavailableError("loopback peer " + std::to_string(peer.id) + " ('" + peer.target->name +
                            "', incarnation " + std::to_string(peer.target->incarnation) +
                            ") is gone: its transport was destroyed");
  }

  // Marks `peer` failed and calls the failure handler, once. Worker only.
  void FailPeer(const std::shared_ptr<Peer>& peer, const Status& why) {
    PeerFailureHandler handler;
    {
      std::lock_guard<std::mutex> lock(mu);
      // A transport being destroyed aborts its batches; it reports no failures.
      if (peer->state != PeerState::kOpen || shutting_down) return;
      peer->state = PeerState::kFailed;
      peer->failure = why;
      handler = on_failure;
    }
    KVB_LOG_INFO("loopback '{}': {}", name, why.ToString());
    if (handler) handler(peer->id, why);
  }

  // Called (via the fabric) when the endpoint `incarnation` is destroyed.
  void NotifyGone(uint64_t gone_incarnation) {
    Enqueue([this, gone_incarnation] {
      std::vector<std::shared_ptr<Peer>> hit;
      {
        std::lock_guard<std::mutex> lock(mu);
        for (auto& [id, p] : peers) {
          if (p->target->incarnation == gone_incarnation) hit.push_back(p);
        }
      }
      for (auto& p : hit) FailPeer(p, GoneStatus(*p));
    });
  }

  // What a batch or message to `peer` ends with before touching memory (OK: go on).
  Status PeerGate(const Peer& peer) {
    std::lock_guard<std::mutex> lock(mu);
    if (shutting_down) return AbortedError("loopback transport '" + name + "' shut down");
    if (peer.state == PeerState::kClosed) {
      return AbortedError("loopback peer " + std::to_string(peer.id) + " was disconnected");
    }
    if (peer.state == PeerState::kFailed) return peer.failure;
    return Status::Ok();
  }

  Status ExecuteBatch(const std::shared_ptr<Peer>& peer, const std::vector<ResolvedOp>& ops) {
    KVB_RETURN_IF_ERROR(PeerGate(*peer));
    Endpoint* target = peer->target.get();
    std::unique_lock<std::mutex> own_lock(region_mu, std::defer_lock);
    std::unique_lock<std::mutex> target_lock(target->region_mu, std::defer_lock);
    if (target == this) {
      own_lock.lock();
    } else {
      std::lock(own_lock, target_lock);
    }
    if (target->dead) {
      own_lock.unlock();
      if (target_lock.owns_lock()) target_lock.unlock();
      FailPeer(peer, GoneStatus(*peer));
      return PeerGate(*peer);
    }
    // Check every op before the first byte moves.
    std::vector<std::pair<uint8_t*, const uint8_t*>> copies;
    copies.reserve(ops.size());
    for (size_t i = 0; i < ops.size(); ++i) {
      const ResolvedOp& op = ops[i];
      auto local = regions.find(op.local_region);
      if (local == regions.end()) {
        return FailedPreconditionError("op " + std::to_string(i) + ": local region " +
                                       std::to_string(op.local_region) +
                                       " was deregistered while a write was pending");
      }
      auto remote = target->regions.find(op.target_region);
      if (remote == target->regions.end()) {
        return FailedPreconditionError("op " + std::to_string(i) + ": region " +
                                       std::to_string(op.target_region) + " of loopback peer " +
                                       std::to_string(peer->id) + " ('" + target->name +
                                       "') was deregistered before the write ran");
      }
      if (!TokenAdmitted(remote->second.grants, op.token)) {
        return Status(StatusCode::kPermissionDenied,
                      "loopback peer " + std::to_string(peer->id) + " ('" + target->name +
                          "') refused the write into region " + std::to_string(op.target_region) +
                          ": its grant was revoked; nothing written");
      }
      copies.emplace_back(remote->second.addr + op.remote_offset,
                          local->second.addr + op.local_offset);
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].length > 0) std::memmove(copies[i].first, copies[i].second, ops[i].length);
    }
    return Status::Ok();
  }

  // Queues `payload` for the target's MessageHandler; false when the target
  // is gone (the message is lost).
  static bool DeliverToTarget(const Peer& peer, std::string payload) {
    Endpoint* target = peer.target.get();
    return !target->gone && target->Enqueue([target, payload = std::move(payload)] {
      MessageHandler handler;
      {
        std::lock_guard<std::mutex> lock(target->mu);
        if (target->shutting_down) return;
        handler = target->on_message;
      }
      if (handler) handler(payload);
    });
  }

  void DeliverMessage(const std::shared_ptr<Peer>& peer, std::string payload) {
    if (!PeerGate(*peer).ok()) return;  // a message to a failed or closed peer is lost
    if (!DeliverToTarget(*peer, std::move(payload))) FailPeer(peer, GoneStatus(*peer));
  }
};

bool RangeInside(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

}  // namespace loopback_detail

using loopback_detail::Endpoint;
using loopback_detail::Peer;
using loopback_detail::PeerState;

struct LoopbackFabric::State {
  uint64_t id = loopback_detail::NextUniqueId();
  mutable std::mutex mu;
  std::map<std::string, std::shared_ptr<Endpoint>, std::less<>> endpoints;  // guarded by mu
};

LoopbackFabric::LoopbackFabric() : state_(std::make_unique<State>()) {}
LoopbackFabric::~LoopbackFabric() = default;

size_t LoopbackFabric::Size() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->endpoints.size();
}

class LoopbackTransport final : public Transport {
 public:
  static Result<std::unique_ptr<Transport>> Create(std::shared_ptr<LoopbackFabric> fabric,
                                                   std::string name);
  ~LoopbackTransport() override;

  std::string_view Name() const override { return "loopback"; }
  const std::string& Address() const override { return ep_->address; }
  void SetMessageHandler(MessageHandler handler) override;
  void SetPeerFailureHandler(PeerFailureHandler handler) override;
  Result<RegisteredRegion> RegisterMemory(void* addr, size_t length, MemoryKind kind) override;
  Status DeregisterMemory(RegionId id) override;
  Result<PeerId> Connect(std::string_view peer_address) override;
  Result<RemoteRegionId> ImportRegion(PeerId peer, std::string_view remote_key) override;
  Result<DataPath> PathTo(PeerId peer) const override;
  // Any reach is mediated: RevokeGrant takes region_mu, held by every copy.
  Result<std::string> GrantRegion(RegionId region, GrantId grant, GrantReach reach) override;
  Status RevokeGrant(GrantId grant) override;
  Status PostWrites(PeerId peer, std::vector<WriteOp> ops, WriteCallback done) override;
  Status SendMessage(PeerId peer, std::string payload) override;
  Status SendUrgentMessage(PeerId peer, std::string payload) override;
  void Disconnect(PeerId peer) override;

 private:
  LoopbackTransport(std::shared_ptr<LoopbackFabric> fabric, std::shared_ptr<Endpoint> ep)
      : fabric_(std::move(fabric)), ep_(std::move(ep)) {}
  // The open peer `id`, or NotFound / Unavailable / FailedPrecondition (ep_->mu held).
  Result<std::shared_ptr<Peer>> OpenPeerLocked(PeerId id) const;

  std::shared_ptr<LoopbackFabric> fabric_;
  std::shared_ptr<Endpoint> ep_;
};

Result<std::unique_ptr<Transport>> LoopbackTransport::Create(std::shared_ptr<LoopbackFabric> fabric,
                                                             std::string name) {
  if (fabric == nullptr) return InvalidArgumentError("loopback transport needs a fabric");
  if (name.empty()) return InvalidArgumentError("loopback transport needs a name");
  auto ep = std::make_shared<Endpoint>();
  ep->name = name;
  ep->incarnation = loopback_detail::NextUniqueId();
  ep->fabric_id = fabric->state_->id;
  ep->address = loopback_detail::EncodeAddress({ep->fabric_id, name, ep->incarnation});
  {
    std::lock_guard<std::mutex> lock(fabric->state_->mu);
    if (fabric->state_->endpoints.count(name) != 0) {
      return AlreadyExistsError("a loopback transport named '" + name +
                                "' is already on this fabric");
    }
    fabric->state_->endpoints[name] = ep;
  }
  // The worker holds the endpoint, so the endpoint outlives the thread.
  ep->worker = std::thread([ep] { ep->Run(); });
  KVB_LOG_DEBUG("loopback '{}' up, incarnation {}", name, ep->incarnation);
  return std::unique_ptr<Transport>(new LoopbackTransport(std::move(fabric), std::move(ep)));
}

LoopbackTransport::~LoopbackTransport() {
  {
    std::lock_guard<std::mutex> lock(ep_->mu);
    ep_->shutting_down = true;
  }
  {
    std::lock_guard<std::mutex> lock(ep_->region_mu);  // waits for copies in flight
    ep_->dead = true;
    ep_->gone = true;
  }
  std::vector<std::shared_ptr<Endpoint>> others;
  {
    std::lock_guard<std::mutex> lock(fabric_->state_->mu);
    auto& eps = fabric_->state_->endpoints;
    auto it = eps.find(ep_->name);
    if (it != eps.end() && it->second == ep_) eps.erase(it);
    for (auto& [name, ep] : eps) others.push_back(ep);
  }
  for (auto& other : others) other->NotifyGone(ep_->incarnation);
  {
    std::lock_guard<std::mutex> lock(ep_->queue_mu);
    ep_->stopping = true;
  }
  ep_->queue_cv.notify_all();
  if (ep_->worker.get_id() == std::this_thread::get_id()) {
    KVB_LOG_ERROR("loopback '{}' destroyed from its own callback; draining in the background",
                  ep_->name);
    ep_->worker.detach();
  } else {
    ep_->worker.join();
  }
}

void LoopbackTransport::SetMessageHandler(MessageHandler handler) {
  std::lock_guard<std::mutex> lock(ep_->mu);
  ep_->on_message = std::move(handler);
}

void LoopbackTransport::SetPeerFailureHandler(PeerFailureHandler handler) {
  std::lock_guard<std::mutex> lock(ep_->mu);
  ep_->on_failure = std::move(handler);
}

Result<RegisteredRegion> LoopbackTransport::RegisterMemory(void* addr, size_t length,
                                                           MemoryKind kind) {
  if (addr == nullptr || length == 0) {
    return InvalidArgumentError("RegisterMemory: null address or zero length (" +
                                std::to_string(length) + " bytes)");
  }
  std::lock_guard<std::mutex> lock(ep_->region_mu);
  if (ep_->dead) return FailedPreconditionError("loopback '" + ep_->name + "' is shutting down");
  RegisteredRegion out;
  out.id = ep_->next_region++;
  ep_->regions[out.id] = {static_cast<uint8_t*>(addr), length};
  out.remote_key = loopback_detail::EncodeKey({ep_->fabric_id, ep_->incarnation, out.id, length},
                                              reinterpret_cast<uintptr_t>(addr), kind);
  return out;
}

Result<std::string> LoopbackTransport::GrantRegion(RegionId region, GrantId grant, GrantReach) {
  if (grant == 0) return InvalidArgumentError("GrantRegion: grant id 0 is reserved");
  KVB_ASSIGN_OR_RETURN(RegionToken token, NewRegionToken());
  std::lock_guard<std::mutex> lock(ep_->region_mu);
  auto it = ep_->regions.find(region);
  if (it == ep_->regions.end()) {
    return NotFoundError("GrantRegion: unknown region " + std::to_string(region));
  }
  it->second.grants.emplace_back(grant, token);
  return loopback_detail::EncodeKey(
      {ep_->fabric_id, ep_->incarnation, region, it->second.length, token},
      reinterpret_cast<uintptr_t>(it->second.addr), MemoryKind::kDram);
}

Status LoopbackTransport::RevokeGrant(GrantId grant) {
  if (grant == 0) return InvalidArgumentError("RevokeGrant: grant id 0 is reserved");
  std::lock_guard<std::mutex> lock(ep_->region_mu);  // waits for copies in flight
  size_t removed = ep_->revoked_grants.count(grant);
  ep_->revoked_grants.insert(grant);
  for (auto& [id, region] : ep_->regions) {
    removed += std::erase_if(region.grants, [&](const auto& g) { return g.first == grant; });
  }
  if (removed != 0) return Status::Ok();
  ep_->revoked_grants.erase(grant);
  return NotFoundError("RevokeGrant: unknown grant " + std::to_string(grant));
}

Status LoopbackTransport::DeregisterMemory(RegionId id) {
  std::lock_guard<std::mutex> lock(ep_->region_mu);
  if (ep_->regions.erase(id) == 0) {
    return NotFoundError("DeregisterMemory: unknown region " + std::to_string(id));
  }
  return Status::Ok();
}

Result<PeerId> LoopbackTransport::Connect(std::string_view peer_address) {
  KVB_ASSIGN_OR_RETURN(loopback_detail::Address a, loopback_detail::DecodeAddress(peer_address));
  if (a.fabric_id != ep_->fabric_id) {
    return InvalidArgumentError("loopback address of '" + a.name + "' belongs to another fabric");
  }
  std::shared_ptr<Endpoint> target;
  {
    std::lock_guard<std::mutex> lock(fabric_->state_->mu);
    auto it = fabric_->state_->endpoints.find(a.name);
    if (it != fabric_->state_->endpoints.end() && it->second->incarnation == a.incarnation) {
      target = it->second;
    }
  }
  if (target == nullptr || target->gone) {
    return UnavailableError("loopback endpoint '" + a.name + "' (incarnation " +
                            std::to_string(a.incarnation) + ") is gone");
  }
  std::lock_guard<std::mutex> lock(ep_->mu);
  if (ep_->shutting_down)
    return FailedPreconditionError("loopback '" + ep_->name + "' is shutting down");
  auto peer = std::make_shared<Peer>();
  peer->id = ep_->next_peer++;
  peer->target = std::move(target);
  ep_->peers[peer->id] = peer;
  KVB_LOG_INFO("loopback '{}': peer {} is '{}' (incarnation {}), path {}", ep_->name, peer->id,
               a.name, a.incarnation, DataPathName(DataPath::kLoopback));
  return peer->id;
}

Result<std::shared_ptr<Peer>> LoopbackTransport::OpenPeerLocked(PeerId id) const {
  if (ep_->shutting_down)
    return FailedPreconditionError("loopback '" + ep_->name + "' is shutting down");
  auto it = ep_->peers.find(id);
  if (it == ep_->peers.end()) return NotFoundError("unknown loopback peer " + std::to_string(id));
  const std::shared_ptr<Peer>& peer = it->second;
  if (peer->state == PeerState::kFailed) return peer->failure;
  if (peer->target->gone) return ep_->GoneStatus(*peer);
  return peer;
}

Result<RemoteRegionId> LoopbackTransport::ImportRegion(PeerId peer_id,
                                                       std::string_view remote_key) {
  std::shared_ptr<Peer> peer;
  {
    std::lock_guard<std::mutex> lock(ep_->mu);
    KVB_ASSIGN_OR_RETURN(peer, OpenPeerLocked(peer_id));
  }
  KVB_ASSIGN_OR_RETURN(loopback_detail::RemoteKey key, loopback_detail::DecodeKey(remote_key));
  Endpoint* target = peer->target.get();
  if (key.fabric_id != ep_->fabric_id || key.incarnation != target->incarnation) {
    return InvalidArgumentError("remote key of region " + std::to_string(key.region) +
                                " is foreign: it belongs to incarnation " +
                                std::to_string(key.incarnation) + ", not loopback peer " +
                                std::to_string(peer_id) + " ('" + target->name + "', incarnation " +
                                std::to_string(target->incarnation) + ")");
  }
  {
    std::lock_guard<std::mutex> lock(target->region_mu);
    auto it = target->regions.find(key.region);
    if (it == target->regions.end() || it->second.length != key.length) {
      return InvalidArgumentError("region " + std::to_string(key.region) +
                                  " is not registered at loopback peer " + std::to_string(peer_id) +
                                  " ('" + target->name + "')");
    }
    if (!loopback_detail::TokenAdmitted(it->second.grants, key.token)) {
      return Status(StatusCode::kPermissionDenied,
                    "region " + std::to_string(key.region) + " of loopback peer " +
                        std::to_string(peer_id) + " ('" + target->name +
                        "'): the key's grant was revoked");
    }
  }
  std::lock_guard<std::mutex> lock(ep_->mu);
  KVB_ASSIGN_OR_RETURN(peer, OpenPeerLocked(peer_id));
  const auto cache_key = std::make_pair(key.region, key.token.bytes);
  auto cached = peer->imported.find(cache_key);
  if (cached != peer->imported.end()) return cached->second;
  RemoteRegionId id = ep_->next_remote++;
  ep_->remote_regions[id] = {peer_id, key.region, key.length, key.token};
  peer->imported[cache_key] = id;
  return id;
}

Result<DataPath> LoopbackTransport::PathTo(PeerId peer) const {
  std::lock_guard<std::mutex> lock(ep_->mu);
  if (ep_->peers.count(peer) == 0)
    return NotFoundError("unknown loopback peer " + std::to_string(peer));
  return DataPath::kLoopback;
}

Status LoopbackTransport::PostWrites(PeerId peer_id, std::vector<WriteOp> ops, WriteCallback done) {
  if (!done) return InvalidArgumentError("PostWrites: no completion callback");
  std::shared_ptr<Peer> peer;
  std::vector<loopback_detail::ResolvedOp> resolved;
  resolved.reserve(ops.size());
  {
    std::lock_guard<std::mutex> lock(ep_->mu);
    KVB_ASSIGN_OR_RETURN(peer, OpenPeerLocked(peer_id));
    std::lock_guard<std::mutex> region_lock(ep_->region_mu);
    for (size_t i = 0; i < ops.size(); ++i) {
      const WriteOp& op = ops[i];
      const std::string where = "PostWrites to loopback peer " + std::to_string(peer_id) + ", op " +
                                std::to_string(i) + ": ";
      auto local = ep_->regions.find(op.local_region);
      if (local == ep_->regions.end()) {
        return InvalidArgumentError(where + "unknown local region " +
                                    std::to_string(op.local_region));
      }
      if (!loopback_detail::RangeInside(op.local_offset, op.length, local->second.length)) {
        return InvalidArgumentError(where + "local range [" + std::to_string(op.local_offset) +
                                    ", +" + std::to_string(op.length) + ") outside region " +
                                    std::to_string(op.local_region) + " of " +
                                    std::to_string(local->second.length) + " bytes");
      }
      auto remote = ep_->remote_regions.find(op.remote_region);
      if (remote == ep_->remote_regions.end() || remote->second.peer != peer_id) {
        return InvalidArgumentError(where + "remote region " + std::to_string(op.remote_region) +
                                    " was not imported on this peer");
      }
      if (!loopback_detail::RangeInside(op.remote_offset, op.length, remote->second.length)) {
        return InvalidArgumentError(where + "remote range [" + std::to_string(op.remote_offset) +
                                    ", +" + std::to_string(op.length) + ") outside remote region " +
                                    std::to_string(op.remote_region) + " of " +
                                    std::to_string(remote->second.length) + " bytes");
      }
      resolved.push_back({op.local_region, op.local_offset, remote->second.target_region,
                          op.remote_offset, op.length, remote->second.token});
    }
  }
  Endpoint* ep = ep_.get();
  bool queued = ep->Enqueue(
      [ep, peer = std::move(peer), resolved = std::move(resolved), done = std::move(done)] {
        Status status = ep->ExecuteBatch(peer, resolved);
        done(status);
      });
  if (!queued) return FailedPreconditionError("loopback '" + ep_->name + "' is shutting down");
  return Status::Ok();
}

Status LoopbackTransport::SendMessage(PeerId peer_id, std::string payload) {
  std::shared_ptr<Peer> peer;
  {
    std::lock_guard<std::mutex> lock(ep_->mu);
    KVB_ASSIGN_OR_RETURN(peer, OpenPeerLocked(peer_id));
  }
  Endpoint* ep = ep_.get();
  bool queued = ep->Enqueue([ep, peer = std::move(peer), payload = std::move(payload)]() mutable {
    ep->DeliverMessage(peer, std::move(payload));
  });
  if (!queued) return FailedPreconditionError("loopback '" + ep_->name + "' is shutting down");
  return Status::Ok();
}

Status LoopbackTransport::SendUrgentMessage(PeerId peer_id, std::string payload) {
  std::shared_ptr<Peer> peer;
  {
    std::lock_guard<std::mutex> lock(ep_->mu);
    KVB_ASSIGN_OR_RETURN(peer, OpenPeerLocked(peer_id));
  }
  // Straight onto the target's queue: not behind our own pending batches.
  ep_->DeliverToTarget(*peer, std::move(payload));
  return Status::Ok();
}

void LoopbackTransport::Disconnect(PeerId peer_id) {
  std::lock_guard<std::mutex> lock(ep_->mu);
  auto it = ep_->peers.find(peer_id);
  if (it == ep_->peers.end()) return;
  it->second->state = PeerState::kClosed;
  ep_->peers.erase(it);
  for (auto r = ep_->remote_regions.begin(); r != ep_->remote_regions.end();) {
    r = r->second.peer == peer_id ? ep_->remote_regions.erase(r) : std::next(r);
  }
}

Result<std::unique_ptr<Transport>> CreateLoopbackTransport(std::shared_ptr<LoopbackFabric> fabric,
                                                           std::string name) {
  return LoopbackTransport::Create(std::move(fabric), std::move(name));
}

}  // namespace kvbridge::internal
