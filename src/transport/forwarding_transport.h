// A Transport that hands every call to another one: the base of wrappers
// that watch, delay or alter a few calls (tests' taps and holds). Override
// those; everything else forwards, so a wrapper never silently drops a call
// it did not mean to change (such as grants or the urgent lane).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "transport/transport.h"

namespace kvbridge::internal {

class ForwardingTransport : public Transport {
 public:
  explicit ForwardingTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}

  std::string_view Name() const override { return inner_->Name(); }
  const std::string& Address() const override { return inner_->Address(); }
  void SetMessageHandler(MessageHandler h) override { inner_->SetMessageHandler(std::move(h)); }
  void SetPeerFailureHandler(PeerFailureHandler h) override {
    inner_->SetPeerFailureHandler(std::move(h));
  }
  std::optional<StepWatch::Busy> DeliveryBusy() const override { return inner_->DeliveryBusy(); }
  Result<RegisteredRegion> RegisterMemory(void* addr, size_t length, MemoryKind kind) override {
    return inner_->RegisterMemory(addr, length, kind);
  }
  Status DeregisterMemory(RegionId id) override { return inner_->DeregisterMemory(id); }
  Result<std::string> GrantRegion(RegionId region, GrantId grant, GrantReach reach) override {
    return inner_->GrantRegion(region, grant, reach);
  }
  Status RevokeGrant(GrantId grant) override { return inner_->RevokeGrant(grant); }
  Result<PeerId> Connect(std::string_view address) override { return inner_->Connect(address); }
  Result<PeerId> ConnectOverNetwork(std::string_view address) override {
    return inner_->ConnectOverNetwork(address);
  }
  const std::string& NetworkAddress() const override { return inner_->NetworkAddress(); }
  Result<RemoteRegionId> ImportRegion(PeerId peer, std::string_view key) override {
    return inner_->ImportRegion(peer, key);
  }
  Result<DataPath> PathTo(PeerId peer) const override { return inner_->PathTo(peer); }
  std::string WireTo(PeerId peer) const override { return inner_->WireTo(peer); }
  Status PostWrites(PeerId peer, std::vector<WriteOp> ops, WriteCallback done) override {
    return inner_->PostWrites(peer, std::move(ops), std::move(done));
  }
  Status SendMessage(PeerId peer, std::string payload) override {
    return inner_->SendMessage(peer, std::move(payload));
  }
  Status SendMessageUnfenced(PeerId peer, std::string payload) override {
    return inner_->SendMessageUnfenced(peer, std::move(payload));
  }
  Status SendUrgentMessage(PeerId peer, std::string payload) override {
    return inner_->SendUrgentMessage(peer, std::move(payload));
  }
  void Disconnect(PeerId peer) override { inner_->Disconnect(peer); }

 protected:
  std::unique_ptr<Transport> inner_;
};

}  // namespace kvbridge::internal
