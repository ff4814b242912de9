#include "transport/fault/fault_transport.h"

#include <utility>

#include "common/log.h"
#include "common/process.h"

namespace kvbridge::internal {
namespace {

using Clock = std::chrono::steady_clock;

bool RangeInside(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

}  // namespace

FaultTransport::FaultTransport(std::unique_ptr<Transport> inner)
    : inner_(std::move(inner)), name_("fault(" + std::string(inner_->Name()) + ")") {
  inner_->SetPeerFailureHandler(
      [this](PeerId peer, const Status& why) { OnInnerFailure(peer, why); });
  worker_ = std::thread([this] { Run(); });
}

FaultTransport::~FaultTransport() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (auto& [id, info] : peers_) {
      FailQueueLocked(info, AbortedError("transport " + name_ + " shut down"));
    }
    FailOrphansLocked(AbortedError("transport " + name_ + " shut down"));
  }
  cv_.notify_all();
  worker_.join();  // runs every queued task first
  // The inner transport may still complete batches through Wrap(), which
  // uses this object's state: it goes first.
  inner_.reset();
}

void FaultTransport::SetMessageHandler(MessageHandler handler) {
  inner_->SetMessageHandler(std::move(handler));
}

void FaultTransport::SetPeerFailureHandler(PeerFailureHandler handler) {
  std::lock_guard<std::mutex> lock(mu_);
  on_failure_ = std::move(handler);
}

Result<RegisteredRegion> FaultTransport::RegisterMemory(void* addr, size_t length,
                                                        MemoryKind kind) {
  KVB_ASSIGN_OR_RETURN(RegisteredRegion region, inner_->RegisterMemory(addr, length, kind));
  std::lock_guard<std::mutex> lock(mu_);
  regions_[region.id] = length;
  return region;
}

Status FaultTransport::DeregisterMemory(RegionId id) {
  KVB_RETURN_IF_ERROR(inner_->DeregisterMemory(id));
  std::lock_guard<std::mutex> lock(mu_);
  regions_.erase(id);
  return Status::Ok();
}

Result<PeerId> FaultTransport::Connect(std::string_view peer_address) {
  if (peer_address.substr(0, kNetworkTag.size()) == kNetworkTag)
    return ConnectOverNetwork(peer_address.substr(kNetworkTag.size()));
  return Connected(inner_->Connect(peer_address), false);
}

void FaultTransport::TagNetworkAddress() {
  tagged_network_address_ = std::string(kNetworkTag) + inner_->NetworkAddress();
}

Result<PeerId> FaultTransport::ConnectOverNetwork(std::string_view peer_address) {
  return Connected(inner_->ConnectOverNetwork(peer_address), true);
}

Result<PeerId> FaultTransport::Connected(Result<PeerId> connected, bool over_network) {
  KVB_ASSIGN_OR_RETURN(PeerId peer, connected);
  std::lock_guard<std::mutex> lock(mu_);
  if (over_network) ++counters_.network_connects;
  PeerInfo& info = peers_[peer];
  if (skip_connects_ > 0) {
    --skip_connects_;
  } else if (mute_connects_ > 0) {
    --mute_connects_;
    info.muted = true;
    info.pass = mute_pass_;
    KVB_LOG_INFO("endpoint {} on {} is mute (fault injection)", peer, name_);
  }
  return peer;
}

Result<FaultTransport::PeerInfo*> FaultTransport::OpenPeerLocked(PeerId peer) {
  if (stopping_) return FailedPreconditionError("transport " + name_ + " is shutting down");
  auto it = peers_.find(peer);
  if (it == peers_.end()) return NotFoundError("unknown peer " + std::to_string(peer));
  if (it->second.failed) return it->second.failure;
  return &it->second;
}

Result<RemoteRegionId> FaultTransport::ImportRegion(PeerId peer, std::string_view remote_key) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    KVB_RETURN_IF_ERROR(OpenPeerLocked(peer).status());
  }
  KVB_ASSIGN_OR_RETURN(RemoteRegionId id, inner_->ImportRegion(peer, remote_key));
  std::lock_guard<std::mutex> lock(mu_);
  remote_[id] = peer;
  return id;
}

Result<DataPath> FaultTransport::PathTo(PeerId peer) const { return inner_->PathTo(peer); }

Status FaultTransport::ValidateLocked(PeerId peer, const std::vector<WriteOp>& ops) const {
  for (size_t i = 0; i < ops.size(); ++i) {
    const WriteOp& op = ops[i];
    const std::string where =
        "PostWrites to peer " + std::to_string(peer) + ", op " + std::to_string(i) + ": ";
    auto local = regions_.find(op.local_region);
    if (local == regions_.end()) {
      return InvalidArgumentError(where + "unknown local region " +
                                  std::to_string(op.local_region));
    }
    if (!RangeInside(op.local_offset, op.length, local->second)) {
      return InvalidArgumentError(where + "local range [" + std::to_string(op.local_offset) +
                                  ", +" + std::to_string(op.length) + ") outside region " +
                                  std::to_string(op.local_region) + " of " +
                                  std::to_string(local->second) + " bytes");
    }
    auto remote = remote_.find(op.remote_region);
    if (remote == remote_.end() || remote->second != peer) {
      return InvalidArgumentError(where + "remote region " + std::to_string(op.remote_region) +
                                  " was not imported on this peer");
    }
  }
  return Status::Ok();
}

WriteCallback FaultTransport::Wrap(PeerId peer, WriteCallback done) {
  return [this, peer, done = std::move(done)](const Status& status) {
    Status out = status;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = peers_.find(peer);
      if (it != peers_.end() && it->second.vanished) {
        out = it->second.failure;
        ++counters_.batches_vanished;
      }
    }
    done(out);
  };
}

Status FaultTransport::PostWrites(PeerId peer, std::vector<WriteOp> ops, WriteCallback done) {
  if (!done) return InvalidArgumentError("PostWrites: no completion callback");
  std::lock_guard<std::mutex> forward_lock(forward_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    KVB_ASSIGN_OR_RETURN(PeerInfo * info, OpenPeerLocked(peer));
    KVB_RETURN_IF_ERROR(ValidateLocked(peer, ops));
    Item item;
    item.ops = std::move(ops);
    item.done = std::move(done);
    auto fail = fail_.find(peer);
    if (fail == fail_.end()) fail = fail_.find(kAllPeers);
    if (fail != fail_.end()) {
      item.fail = fail->second;
    } else if (hold_) {
      item.held = true;
      ++counters_.batches_held;
    } else if (delay_.count() > 0) {
      item.not_before = Clock::now() + delay_;
      ++counters_.batches_delayed;
    }
    const bool plain = item.fail.ok() && !item.held && item.not_before == Clock::time_point();
    if (!plain || !info->queue.empty()) {
      info->queue.push_back(std::move(item));
      cv_.notify_all();
      return Status::Ok();
    }
    ops = std::move(item.ops);
    done = std::move(item.done);
  }
  // Nothing queued ahead of it: straight through, so the inner transport's
  // own validation answers this call.
  KVB_RETURN_IF_ERROR(inner_->PostWrites(peer, std::move(ops), Wrap(peer, std::move(done))));
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.batches_forwarded;
  return Status::Ok();
}

Status FaultTransport::SendMessage(PeerId peer, std::string payload) {
  std::lock_guard<std::mutex> forward_lock(forward_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    KVB_ASSIGN_OR_RETURN(PeerInfo * info, OpenPeerLocked(peer));
    if (info->muted && info->pass > 0) {
      --info->pass;
    } else if (info->muted) {
      ++counters_.muted_dropped;
      return Status::Ok();
    }
    if (drop_messages_) {
      ++counters_.messages_dropped;
      return Status::Ok();
    }
    if (!info->queue.empty() || hold_messages_) {
      Item item;
      item.is_batch = false;
      item.payload = std::move(payload);
      if (hold_messages_) {
        item.held = true;
        ++counters_.messages_held;
      }
      info->queue.push_back(std::move(item));
      cv_.notify_all();
      return Status::Ok();
    }
  }
  KVB_RETURN_IF_ERROR(inner_->SendMessage(peer, std::move(payload)));
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.messages_forwarded;
  return Status::Ok();
}

Status FaultTransport::SendUrgentMessage(PeerId peer, std::string payload) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    KVB_ASSIGN_OR_RETURN(PeerInfo * info, OpenPeerLocked(peer));
    if (info->muted) {
      ++counters_.muted_dropped;
      return Status::Ok();
    }
    if (drop_urgent_) {
      ++counters_.urgent_dropped;
      return Status::Ok();
    }
  }
  KVB_RETURN_IF_ERROR(inner_->SendUrgentMessage(peer, std::move(payload)));
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.urgent_forwarded;
  return Status::Ok();
}

void FaultTransport::HoldRevokes(bool hold) {
  std::lock_guard<std::mutex> lock(mu_);
  hold_revokes_ = hold;
  cv_.notify_all();
}

void FaultTransport::FailRevokesOfGrantsSoFar(bool fail) {
  std::lock_guard<std::mutex> lock(mu_);
  failing_revokes_ = fail ? granted_ : std::set<GrantId>{};
}

Result<std::string> FaultTransport::GrantRegion(RegionId region, GrantId grant, GrantReach reach) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    granted_.insert(grant);
  }
  return inner_->GrantRegion(region, grant, reach);
}

Status FaultTransport::RevokeGrant(GrantId grant) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    ++counters_.revokes_started;
    cv_.wait(lock, [&] { return !hold_revokes_; });
    if (failing_revokes_.count(grant) > 0) {
      ++counters_.revokes_failed;
      return DeadlineExceededError("revoke of grant " + std::to_string(grant) +
                                   " timed out (FailRevokesOfGrantsSoFar)");
    }
  }
  Status st = inner_->RevokeGrant(grant);
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.revokes_returned;
  return st;
}

void FaultTransport::Disconnect(PeerId peer) {
  std::lock_guard<std::mutex> forward_lock(forward_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end()) return;
    if (keep_held_) {
      std::erase_if(it->second.queue, [&](Item& item) {
        if (!item.is_batch || !item.held) return false;
        orphans_.push_back(std::move(item.done));
        return true;
      });
    }
    FailQueueLocked(it->second, AbortedError("peer " + std::to_string(peer) + " was disconnected"));
    peers_.erase(it);
    for (auto r = remote_.begin(); r != remote_.end();) {
      r = r->second == peer ? remote_.erase(r) : std::next(r);
    }
    cv_.notify_all();
  }
  inner_->Disconnect(peer);
}

void FaultTransport::FailOrphansLocked(const Status& why) {
  for (WriteCallback& done : orphans_)
    tasks_.push_back([done = std::move(done), why] { done(why); });
  orphans_.clear();
}

void FaultTransport::FailQueueLocked(PeerInfo& info, const Status& why) {
  for (Item& item : info.queue) {
    if (item.is_batch) {
      tasks_.push_back([done = std::move(item.done), why] { done(why); });
    } else {
      ++counters_.messages_dropped;
    }
  }
  info.queue.clear();
}

void FaultTransport::OnInnerFailure(PeerId peer, const Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(peer);
  if (it == peers_.end() || it->second.failed) return;  // vanished already: reported once
  it->second.failed = true;
  it->second.failure = why;
  // The handler first, then the queued batches: as the inner transport does.
  tasks_.push_back([this, peer, why] {
    PeerFailureHandler handler;
    {
      std::lock_guard<std::mutex> lock(mu_);
      handler = on_failure_;
    }
    if (handler) handler(peer, why);
  });
  FailQueueLocked(it->second, why);
  cv_.notify_all();
}

void FaultTransport::FailWrites(PeerId peer, Status why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (why.ok()) {
    fail_.erase(peer);
  } else {
    fail_[peer] = std::move(why);
  }
}

void FaultTransport::DelayWrites(std::chrono::milliseconds delay) {
  std::lock_guard<std::mutex> lock(mu_);
  delay_ = delay;
}

void FaultTransport::HoldMessages() {
  std::lock_guard<std::mutex> lock(mu_);
  hold_messages_ = true;
}

void FaultTransport::ReleaseHeldMessages() {
  std::lock_guard<std::mutex> lock(mu_);
  hold_messages_ = false;
  for (auto& [id, info] : peers_) {
    for (Item& item : info.queue)
      if (!item.is_batch) item.held = false;
  }
  cv_.notify_all();
}

size_t FaultTransport::HeldMessages() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [id, info] : peers_) {
    for (const Item& item : info.queue) n += !item.is_batch && item.held ? 1 : 0;
  }
  return n;
}

std::vector<std::string> FaultTransport::HeldMessagePayloads() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> held;
  for (const auto& [id, info] : peers_) {
    for (const Item& item : info.queue)
      if (!item.is_batch && item.held) held.push_back(item.payload);
  }
  return held;
}

void FaultTransport::HoldWrites() {
  std::lock_guard<std::mutex> lock(mu_);
  hold_ = true;
}

void FaultTransport::KeepHeldWritesPastDisconnect(bool keep) {
  std::lock_guard<std::mutex> lock(mu_);
  keep_held_ = keep;
}

void FaultTransport::ReleaseHeldWrites() {
  std::lock_guard<std::mutex> lock(mu_);
  hold_ = false;
  FailOrphansLocked(AbortedError("its endpoint was disconnected while the batch was held"));
  for (auto& [id, info] : peers_) {
    for (Item& item : info.queue)
      if (item.is_batch) item.held = false;
  }
  cv_.notify_all();
}

size_t FaultTransport::HeldBatches() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = orphans_.size();
  for (const auto& [id, info] : peers_) {
    for (const Item& item : info.queue) n += item.is_batch && item.held ? 1 : 0;
  }
  return n;
}

void FaultTransport::MuteConnects(int skip, int n, int pass) {
  std::lock_guard<std::mutex> lock(mu_);
  skip_connects_ = skip;
  mute_connects_ = n;
  mute_pass_ = pass;
}

void FaultTransport::DropMessages(bool drop) {
  std::lock_guard<std::mutex> lock(mu_);
  drop_messages_ = drop;
}

void FaultTransport::VanishPeer(PeerId peer) {
  // With forward_mu_ held no batch is between the queue and the inner
  // transport: each one either reaches the inner first or fails here.
  std::lock_guard<std::mutex> forward_lock(forward_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(peer);
  if (it == peers_.end() || it->second.failed) return;
  Status why = UnavailableError("peer " + std::to_string(peer) + " vanished (fault injection on " +
                                name_ + ")");
  KVB_LOG_INFO("{}", why.ToString());
  ++counters_.peers_vanished;
  it->second.failed = true;
  it->second.vanished = true;
  it->second.failure = why;
  tasks_.push_back([this, peer, why] {
    PeerFailureHandler handler;
    {
      std::lock_guard<std::mutex> lock(mu_);
      handler = on_failure_;
    }
    if (handler) handler(peer, why);
  });
  for (Item& item : it->second.queue) counters_.batches_vanished += item.is_batch ? 1 : 0;
  FailQueueLocked(it->second, why);
  cv_.notify_all();
}

void FaultTransport::DropUrgentMessages(bool drop) {
  std::lock_guard<std::mutex> lock(mu_);
  drop_urgent_ = drop;
}

FaultCounters FaultTransport::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

bool FaultTransport::HeadReadyLocked(const Item& item, Clock::time_point now) const {
  if (item.is_batch && !item.fail.ok()) return true;
  return !item.held && item.not_before <= now;
}

void FaultTransport::Run() {
  NameThisThread("kvb-fault");
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (!tasks_.empty()) {
      Task task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
      continue;
    }
    if (stopping_) return;
    const Clock::time_point now = Clock::now();
    bool ready = false;
    Clock::time_point next = Clock::time_point::max();
    for (const auto& [id, info] : peers_) {
      if (info.queue.empty()) continue;
      const Item& head = info.queue.front();
      if (HeadReadyLocked(head, now)) {
        ready = true;
      } else if (!head.held) {
        next = std::min(next, head.not_before);
      }
    }
    if (ready) {
      lock.unlock();
      Pump();
      lock.lock();
    } else if (next != Clock::time_point::max()) {
      cv_.wait_until(lock, next);
    } else {
      cv_.wait(lock);
    }
  }
}

void FaultTransport::Pump() {
  std::vector<Task> callbacks;  // run after the locks are released
  {
    std::lock_guard<std::mutex> forward_lock(forward_mu_);
    while (true) {
      PeerId peer = 0;
      Item item;
      {
        std::lock_guard<std::mutex> lock(mu_);
        const Clock::time_point now = Clock::now();
        for (auto& [id, info] : peers_) {
          if (!info.queue.empty() && HeadReadyLocked(info.queue.front(), now)) {
            peer = id;
            item = std::move(info.queue.front());
            info.queue.pop_front();
            break;
          }
        }
        if (peer == 0) break;
        if (item.is_batch && !item.fail.ok()) {
          ++counters_.batches_failed;
          callbacks.push_back([done = std::move(item.done), why = item.fail] { done(why); });
          continue;
        }
      }
      if (item.is_batch) {
        WriteCallback done = item.done;  // kept in case the inner rejects the batch
        Status st = inner_->PostWrites(peer, std::move(item.ops), Wrap(peer, item.done));
        std::lock_guard<std::mutex> lock(mu_);
        if (st.ok()) {
          ++counters_.batches_forwarded;
        } else {
          callbacks.push_back([done = std::move(done), st] { done(st); });
        }
      } else {
        Status st = inner_->SendMessage(peer, std::move(item.payload));
        std::lock_guard<std::mutex> lock(mu_);
        ++(st.ok() ? counters_.messages_forwarded : counters_.messages_dropped);
      }
    }
  }
  for (Task& callback : callbacks) callback();
}

}  // namespace kvbridge::internal
