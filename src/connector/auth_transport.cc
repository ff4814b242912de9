#include "connector/auth_transport.h"

#include <fmt/format.h>

namespace kvbridge::internal {

AuthTransport::AuthTransport(std::unique_ptr<Transport> inner)
    : ForwardingTransport(std::move(inner)) {}

void AuthTransport::SetAuthHandlers(AuthHandler on_message, RejectHandler on_reject) {
  on_message_ = std::move(on_message);
  on_reject_ = std::move(on_reject);
  inner_->SetMessageHandler([this](std::string_view bytes) { OnInner(bytes); });
}

void AuthTransport::Bind(PeerId peer, const Binding& b) {
  MutexLock lock(mu_);
  auto old = out_.find(peer);
  if (old != out_.end()) in_.erase(old->second.local_session);
  Outgoing& o = out_[peer];
  o = Outgoing{};
  o.key = b.send_key;
  o.remote_session = b.remote_session;
  o.local_session = b.local_session;
  Incoming& i = in_[b.local_session];
  i = Incoming{};
  i.key = b.recv_key;
  i.proven = b.proven;
}

void AuthTransport::Share(PeerId extra, PeerId main) {
  MutexLock lock(mu_);
  shared_[extra] = main;
}

Status AuthTransport::SendPlain(PeerId peer, std::string payload) {
  return inner_->SendMessage(peer, std::move(payload));
}

Result<std::string> AuthTransport::SealFor(PeerId peer, SealLane lane, std::string_view payload) {
  SessionKey key;
  SealedHeader h;
  {
    MutexLock lock(mu_);
    auto shared = shared_.find(peer);
    auto it = out_.find(shared == shared_.end() ? peer : shared->second);
    if (it == out_.end())
      return FailedPreconditionError(
          fmt::format("peer {}: no authenticated session (its handshake has not completed)", peer));
    key = it->second.key;
    h.lane = shared == shared_.end() ? lane : SealLane::kSecond;
    h.session = it->second.remote_session;
    h.seq = it->second.next_seq[static_cast<int>(h.lane)]++;
  }
  return Seal(key, h, payload);
}

Status AuthTransport::SendMessage(PeerId peer, std::string payload) {
  MutexLock order(send_mu_);
  KVB_ASSIGN_OR_RETURN(std::string sealed, SealFor(peer, SealLane::kOrdered, payload));
  return inner_->SendMessage(peer, std::move(sealed));
}

Status AuthTransport::SendMessageUnfenced(PeerId peer, std::string payload) {
  MutexLock order(send_mu_);
  KVB_ASSIGN_OR_RETURN(std::string sealed, SealFor(peer, SealLane::kUnfenced, payload));
  return inner_->SendMessageUnfenced(peer, std::move(sealed));
}

Status AuthTransport::SendUrgentMessage(PeerId peer, std::string payload) {
  MutexLock order(send_mu_);
  KVB_ASSIGN_OR_RETURN(std::string sealed, SealFor(peer, SealLane::kUrgent, payload));
  return inner_->SendUrgentMessage(peer, std::move(sealed));
}

void AuthTransport::Disconnect(PeerId peer) {
  {
    MutexLock lock(mu_);
    auto it = out_.find(peer);
    if (it != out_.end()) {
      in_.erase(it->second.local_session);
      out_.erase(it);
    }
    std::erase_if(shared_, [&](const auto& e) { return e.first == peer || e.second == peer; });
  }
  inner_->Disconnect(peer);
}

void AuthTransport::OnInner(std::string_view bytes) {
  if (!LooksSealed(bytes)) {
    on_message_(bytes, nullptr);
    return;
  }
  Status refused;
  std::string_view payload;
  RankId proven;
  [&] {
    Result<SealedHeader> h = ParseSealed(bytes);
    if (!h.ok()) {
      refused = h.status();
      return;
    }
    MutexLock lock(mu_);
    auto it = in_.find(h->session);
    if (it == in_.end()) {
      refused = UnauthenticatedError(
          fmt::format("sealed message of {} bytes for session {:#x}, which no handshake opened "
                      "here (or which closed)",
                      bytes.size(), h->session));
      return;
    }
    Result<std::string_view> opened = OpenSealed(it->second.key, bytes);
    if (!opened.ok()) {
      refused = opened.status().WithContext(it->second.proven.ShortName());
      return;
    }
    if (!it->second.windows[static_cast<int>(h->lane)].Accept(h->seq)) {
      refused = UnauthenticatedError(
          fmt::format("{}: sealed message {} of lane {} replayed or too old",
                      it->second.proven.ShortName(), h->seq, static_cast<int>(h->lane)));
      return;
    }
    payload = *opened;
    proven = it->second.proven;
  }();
  if (!refused.ok()) {
    if (on_reject_) on_reject_(refused);
    return;
  }
  on_message_(payload, &proven);
}

}  // namespace kvbridge::internal
