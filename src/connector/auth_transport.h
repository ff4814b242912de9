// AuthTransport: a Transport that seals every message it sends on an
// endpoint whose handshake completed, and opens what it receives, telling
// its user which proven rank (if any) a message came from (peer_auth.h).
//
// The transport below gives a message no sender (connections are one-way,
// and a UCX worker accepts messages from anyone who has its address), so a
// rank's identity is bound to the session keys its handshake proved rather
// than to an endpoint: a message opens under the session its id names, or
// it is refused. Plain (unsealed) messages are passed up with no proven
// sender; the manager accepts only handshake messages that way.
//
// Writes, regions and connections pass straight through. Sending on an
// endpoint with no session fails (FailedPrecondition): nothing but the
// handshake (SendPlain) leaves unauthenticated.
//
// Thread safety: every method is thread-safe; the handlers run on the inner
// transport's threads, never under this class's lock.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>

#include "common/thread_annotations.h"
#include "connector/peer_auth.h"
#include "transport/forwarding_transport.h"
#include "transport/transport.h"

namespace kvbridge::internal {

class AuthTransport final : public ForwardingTransport {
 public:
  explicit AuthTransport(std::unique_ptr<Transport> inner);
  // Stops the inner transport first: its threads deliver into this one's
  // session tables until they are joined (ThreadSanitizer saw the tables
  // freed under a delivery when members went in declaration order).
  ~AuthTransport() override { inner_.reset(); }

  // A message that arrived: `proven` is the rank whose session it opened
  // under, or null for a plain message.
  using AuthHandler = std::function<void(std::string_view payload, const RankId* proven)>;
  // A sealed message refused (unknown session, bad tag, replayed), and why.
  using RejectHandler = std::function<void(const Status& why)>;
  // Set both before the first Connect.
  void SetAuthHandlers(AuthHandler on_message, RejectHandler on_reject);

  // One side of a session.
  struct Binding {
    SessionKey send_key{};
    uint64_t remote_session = 0;  // the peer's id for the session
    SessionKey recv_key{};
    uint64_t local_session = 0;  // ours: messages to us carry it
    RankId proven;               // who the handshake proved the peer to be
  };
  // Every message to `peer` is sealed under `b` from now on, and messages
  // carrying b.local_session open as `b.proven`'s. Replaces an earlier
  // binding of `peer` (and forgets its session).
  void Bind(PeerId peer, const Binding& b);
  // Messages to `extra`, a second endpoint to the peer of `main` (the
  // heartbeat endpoint), are sealed under `main`'s session and share its
  // sequence numbers, so no number is used twice. Follows a later Bind of
  // `main`; forgotten when either endpoint is disconnected.
  void Share(PeerId extra, PeerId main);
  // Sends a handshake message unsealed.
  Status SendPlain(PeerId peer, std::string payload);

  // Plain handlers are not used: SetAuthHandlers is. Kept for the interface.
  void SetMessageHandler(MessageHandler) override {}
  // Everything but the messages forwards (ForwardingTransport).
  Status SendMessage(PeerId peer, std::string payload) override;
  Status SendMessageUnfenced(PeerId peer, std::string payload) override;
  Status SendUrgentMessage(PeerId peer, std::string payload) override;
  // Forgets the endpoint's session too.
  void Disconnect(PeerId peer) override;

  Transport& inner() { return *inner_; }

 private:
  struct Outgoing {
    SessionKey key{};
    uint64_t remote_session = 0;
    uint64_t local_session = 0;
    uint64_t next_seq[kSealLanes] = {};
  };
  struct Incoming {
    SessionKey key{};
    RankId proven;
    ReplayWindow windows[kSealLanes];
  };
  // The sealed bytes for `peer`, or FailedPrecondition without a session.
  Result<std::string> SealFor(PeerId peer, SealLane lane, std::string_view payload);
  void OnInner(std::string_view bytes);

  AuthHandler on_message_;
  RejectHandler on_reject_;
  // Held from taking a sequence number to handing the sealed bytes to
  // `inner_` (which only queues them), so messages reach the inner transport
  // in the order of their numbers. Without it a thread preempted between the
  // two while other threads sent more than ReplayWindow::kReplayWindow
  // messages on the lane (10,000 rooms' metadata in a burst) had its message
  // dropped by the receiver as too old. Taken before `mu_`.
  Mutex send_mu_;
  mutable Mutex mu_;
  std::unordered_map<PeerId, Outgoing> out_ KVB_GUARDED_BY(mu_);
  std::unordered_map<uint64_t, Incoming> in_ KVB_GUARDED_BY(mu_);
  std::unordered_map<PeerId, PeerId> shared_ KVB_GUARDED_BY(mu_);  // extra -> main
};

}  // namespace kvbridge::internal
