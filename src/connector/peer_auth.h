// Peers prove who they are (issue 12, finding 6): the cryptography of the
// rank-to-rank handshake and of the messages that follow it. Sans-I/O: pure
// functions and small value types; no socket, thread or clock.
//
// The handshake (docs/protocol.md, "The handshake"), decode D to prefill P:
//
//   D -> P  Hello          D's RankId, layout, keys, nonce Nd, session id Sd
//   P -> D  HelloChallenge P's RankId, nonce Np, session id Sp,
//                          proof_P = HMAC(K, "prefill" | T)
//   D -> P  HelloProof     proof_D = HMAC(K, "decode" | T)
//   P -> D  HelloAck       sealed: the first message of the session
//
// K = HMAC-SHA256(deployment secret, fixed label): the secret every rank
// holds (control/auth.h). T (Transcript) covers the Hello exactly as sent
// (so D's RankId with its incarnation, its layout, its remote keys, Nd and
// Sd), P's RankId with its incarnation, Np and Sp. Each side checks the
// other's proof over a transcript with its own fresh nonce, so an old
// handshake replayed, or one made without the secret, proves nothing. The
// session keys come from T too, one per direction, so one direction's
// messages cannot be reflected as the other's.
//
// After the handshake every message is sealed: [magic, lane, receiver's
// session id, sequence number] payload [HMAC tag, 128 bits], under the
// sender's direction key. The receiver looks the session up by its id,
// checks the tag and refuses a sequence number it has seen (ReplayWindow).
// The session id names the rank that proved it: a message is that rank's
// or nobody's.
//
// Thread safety: everything here is a pure function or a value type.
#pragma once

#include <array>
#include <bitset>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "common/digest.h"
#include "common/host_identity.h"
#include "kvbridge/errors.h"
#include "kvbridge/status.h"

namespace kvbridge::internal {

using Nonce = std::array<uint8_t, 16>;
using SessionKey = std::array<uint8_t, 32>;

// A fresh nonce from the kernel CSPRNG; Internal when it cannot be read.
Result<Nonce> NewNonce();

// Where a rank says it runs (host, boot id, pid), for common/host_identity.h's
// SameHost and SameProcess: the connector's only same-host test.
HostIdentity HostOf(const RankId& id);

// The same process: same position (RankId::SameRank), host, boot id, pid and
// incarnation. A sealed message must name exactly the rank its session
// proved.
bool SameProcess(const RankId& a, const RankId& b);

// Whether `r` is the notice a rank that failed a peer sends it (with
// sglang's server, which keeps no records): a rank failure of exactly the
// process `failed` (position and incarnation), found by `detector`
// (SameProcess). The sender builds it and the receiver admits it by this
// one rule.
bool IsFailureNotice(const FailureRecord& r, const RankId& failed, const RankId& detector);

struct SessionKeys {
  SessionKey decode_to_prefill{};
  SessionKey prefill_to_decode{};
};

class HandshakeAuth {
 public:
  // `secret`: the deployment's token (ResolveAuthToken).
  explicit HandshakeAuth(std::string_view secret);

  // What both proofs cover: the SHA-256 of the Hello's bytes as sent, and
  // the prefill rank's identity, nonce and session id.
  static std::string Transcript(const Digest& hello_digest, const RankId& prefill,
                                const Nonce& prefill_nonce, uint64_t prefill_session);
  // `prover`'s proof over `transcript` (Role::kPrefill or Role::kDecode).
  Digest Prove(Role prover, std::string_view transcript) const;
  // Ok when `proof` is `prover`'s over `transcript` under this rank's
  // secret; Unauthenticated naming `who` (the rank it claims to be) and the
  // variables that hold the secret otherwise.
  Status Verify(Role prover, std::string_view transcript, const Digest& proof,
                std::string_view who) const;
  SessionKeys Keys(std::string_view transcript) const;
  // A Hello's tag over the address prefill answers it on, and its session
  // id and nonce (HelloMsg::address_tag). Prefill connects back to that
  // address before any proof, and UCX's parser of a worker address trusts
  // its input (a malformed one aborts the process): only an address a
  // holder of the secret tagged reaches it. A replayed Hello still carries
  // a genuine address; the challenge-proof exchange refuses the replay.
  Digest TagAddress(std::string_view address, uint64_t session, const Nonce& nonce) const;
  // HMAC under the secret's key of `purpose` and `data` (length-prefixed
  // each): a tag no one without the secret can make, one per purpose.
  Digest Tag(std::string_view purpose, std::string_view data) const;
  // Ok when `tag` is TagAddress's; Unauthenticated naming `who` otherwise.
  Status CheckAddressTag(std::string_view address, uint64_t session, const Nonce& nonce,
                         const Digest& tag, std::string_view who) const;

 private:
  std::array<uint8_t, 32> key_{};
};

// Prefill's challenges, kept nowhere (docs/security.md, "A flood of
// Hellos"): the nonce and session id a challenge gives are derived from a
// key of this process, the SHA-256 of the Hello and the time window it came
// in. The proof brings the Hello back (HelloProofMsg::hello) and prefill
// derives the challenge again, so no table of pending Hellos exists for a
// flood of Hellos (which needs no secret) to push the genuine one out of.
// A challenge is good in its window and the next one
// (kWindow..2*kWindow); replays of a proof are the caller's to refuse
// (ManagerImpl keeps the sessions proven in that time).
struct Challenge {
  Nonce nonce{};
  uint64_t session = 0;  // never 0
};
class ChallengeMaker {
 public:
  static constexpr std::chrono::seconds kWindow{30};
  // Under a fresh key from the kernel CSPRNG; Internal when none.
  static Result<ChallengeMaker> Create();
  explicit ChallengeMaker(const std::array<uint8_t, 32>& key) : key_(key) {}
  // The challenge for a Hello whose bytes hash to `hello_digest`, at `now`.
  Challenge For(const Digest& hello_digest, SteadyTime now) const;
  // The challenge of session id `session` that this maker gave the Hello at
  // `now` or in the window before; nullopt for any other session id.
  std::optional<Challenge> Find(const Digest& hello_digest, uint64_t session, SteadyTime now) const;

 private:
  Challenge InWindow(const Digest& hello_digest, int64_t window) const;
  std::array<uint8_t, 32> key_{};
};

// Sealed messages. A plain control message starts with "KVBP"
// (protocol.h); a sealed one with "KVBS".
inline constexpr size_t kSealHeaderBytes = 4 + 1 + 8 + 8;
inline constexpr size_t kSealTagBytes = 16;
// kSecond: whatever is sent on an endpoint shared with the session's main
// one (AuthTransport::Share: heartbeats). It is its own connection, so its
// messages arrive in their own order, and a beat there must not move a
// main lane's window past a burst still queued behind writes.
enum class SealLane : uint8_t { kOrdered = 0, kUnfenced = 1, kUrgent = 2, kSecond = 3 };
inline constexpr int kSealLanes = 4;

struct SealedHeader {
  SealLane lane = SealLane::kOrdered;
  uint64_t session = 0;  // the receiver's session id
  uint64_t seq = 0;      // per lane, from 0
};

std::string Seal(const SessionKey& key, const SealedHeader& header, std::string_view payload);
bool LooksSealed(std::string_view bytes);
// The clear header of a sealed message; InvalidArgument when it is too
// short or names no lane.
Result<SealedHeader> ParseSealed(std::string_view bytes);
// The payload when the tag is `key`'s over header and payload;
// Unauthenticated otherwise.
Result<std::string_view> OpenSealed(const SessionKey& key, std::string_view bytes);

// Which sequence numbers of one lane were seen: refuses one seen before or
// older than the last kReplayWindow. Messages of one lane arrive in order
// except where sender threads race between numbering and sending, so the
// window only has to cover that race.
class ReplayWindow {
 public:
  static constexpr uint64_t kReplayWindow = 1024;
  // True (and remembered) for a sequence number not seen and not too old.
  bool Accept(uint64_t seq);

 private:
  bool any_ = false;
  uint64_t highest_ = 0;
  std::bitset<kReplayWindow> seen_;  // bit i: highest_ - i was seen
};

}  // namespace kvbridge::internal
