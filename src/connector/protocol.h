// Control messages between ranks (carried by Transport::SendMessage).
//
// Every message starts with its type and the sender's RankId (with its
// incarnation, so a message from a dead process's previous life is told
// apart). Room messages carry (room, generation): room ids are reused by
// schedulers, the generation names one use of a room.
//
//   decode -> prefill  Hello       memory description + remote keys (once per peer)
//   prefill -> decode  HelloAck    OK, or why the layout is refused
//   decode -> prefill  Meta        a request's destination pages, aux, state
//   prefill -> decode  Notify      a chunk's writes are visible (sent after them)
//   either             RoomFailed  this request failed (record); the sender
//                                  posts nothing more for (room, generation)
//   prefill -> decode  Quiesced    nothing of (room, generation) is in flight
//   either             Heartbeat   liveness
//   either             RankFailed  a rank failed (record); for siblings
//   prefill -> decode  HelloChallenge  prefill's nonce and proof (peer_auth.h)
//   decode -> prefill  HelloProof      decode's proof
//
// Hello, HelloChallenge and HelloProof travel plain; every other message is
// sealed under the session their handshake opened (peer_auth.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "connector/peer_auth.h"
#include "engine/plan.h"
#include "kvbridge/errors.h"
#include "kvbridge/status.h"

namespace kvbridge::internal {

// What a peer may declare. A message past one of these is garbled: the
// decoder rejects it, naming the field, before anything is allocated for it.
// Rank positions (dp/tp/pp/cp) lie in [0, kMaxParallelSize); tp sizes in
// [1, kMaxParallelSize] (ManagerOptions enforces the same locally).
inline constexpr int kMaxParallelSize = 1024;
// Destination pages (and state slots) in one Meta, and a request's prefix.
inline constexpr uint32_t kMaxPagesPerMessage = 1u << 24;
// kv, aux or state buffers in a layout (and remote keys in a Hello).
inline constexpr uint32_t kMaxBuffers = 4096;
// One buffer's length; its address plus length must not wrap either.
inline constexpr uint64_t kMaxBufferBytes = uint64_t{1} << 48;
inline constexpr uint32_t kMaxNameBytes = 256;        // host, instance, dtype
inline constexpr uint32_t kMaxBlobBytes = 64 << 10;   // a transport address, a remote key
inline constexpr uint32_t kMaxTextBytes = 16 << 10;   // detail, mechanism, hint, HelloAck text
inline constexpr uint32_t kMaxHelloBytes = 16 << 20;  // an encoded Hello
// Timestamps (microseconds since the epoch) lie in [0, kMaxTimestampMicros]:
// about the year 2116, where the difference of any two still fits a
// system_clock duration.
inline constexpr int64_t kMaxTimestampMicros = INT64_MAX / 2 / 1000;

struct HelloMsg {
  RankLayout layout;
  int tp_size = 1;
  std::string address;  // transport address to answer on
  std::vector<std::string> kv_keys, aux_keys, state_keys;
  // The handshake: decode's session id (what prefill's sealed messages to
  // it carry) and its fresh nonce.
  uint64_t session = 0;
  Nonce nonce{};
  // HandshakeAuth::TagAddress over address, session and nonce: prefill
  // checks it before it connects back to `address` (peer_auth.h says why).
  Digest address_tag{};
};
struct HelloChallengeMsg {
  uint64_t decode_session = 0;  // the Hello's session id: which Hello this answers
  uint64_t session = 0;         // prefill's session id
  Nonce nonce{};
  Digest proof{};  // HandshakeAuth::Prove(kPrefill, transcript)
};
struct HelloProofMsg {
  uint64_t session = 0;  // prefill's session id from the challenge
  Digest proof{};        // HandshakeAuth::Prove(kDecode, transcript)
  // The Hello it answers, its bytes exactly as sent: prefill keeps no
  // Hello (peer_auth.h, ChallengeMaker) and finds the challenge again from
  // it. At most kMaxHelloBytes.
  std::string hello;
};
// A HelloAck with this code refuses a process that a failure record held by
// prefill declared failed (hello_rule.h, kToldItFailed): not a failure of
// prefill; decode learns the record from its registry. Never the code of
// another refusal (AcceptHello gives those FailedPrecondition instead).
inline constexpr StatusCode kRefusedAsDeclaredFailed = StatusCode::kPermissionDenied;
struct HelloAckMsg {
  StatusCode code = StatusCode::kOk;
  std::string message;
  std::string address;
  // The path the acknowledging rank writes into the Hello's sender by
  // ("shm", "cma", "ucx-rndv", ...; DataPathName), so that a receiver that
  // only exports memory can name it; "" when unknown. Optional on the wire:
  // an ack without it decodes with "".
  std::string path;
};
struct MetaMsg {
  uint64_t room = 0;
  uint64_t generation = 0;
  int decode_tp_size = 1;
  bool dummy = false;  // this prefill rank sends nothing; it only concludes
  std::vector<int32_t> pages;
  int64_t aux_index = -1;
  std::vector<int32_t> state;
  int64_t prefix_pages = 0;
};
struct NotifyMsg {
  uint64_t room = 0;
  uint64_t generation = 0;
  uint32_t chunk = 0;
  bool last = false;
  uint32_t pages = 0;
};
struct RoomFailedMsg {
  uint64_t room = 0;
  uint64_t generation = 0;
  // From prefill: true when nothing of the request is in flight any more;
  // false means a Quiesced message follows once it drained.
  bool quiesced = false;
  FailureRecord record;
};
struct QuiescedMsg {
  uint64_t room = 0;
  uint64_t generation = 0;
};
struct HeartbeatMsg {
  uint64_t seq = 0;
};
struct RankFailedMsg {
  FailureRecord record;
};

using MessageBody =
    std::variant<HelloMsg, HelloAckMsg, MetaMsg, NotifyMsg, RoomFailedMsg, QuiescedMsg,
                 HeartbeatMsg, RankFailedMsg, HelloChallengeMsg, HelloProofMsg>;
// "Hello", "Meta", ...: the body's type, for logs.
std::string_view MessageTypeName(const MessageBody& body);

struct Message {
  RankId from;
  MessageBody body;
};

std::string EncodeMessage(const RankId& from, const MessageBody& body);
// InvalidArgument for a truncated, garbled or unknown message, or one whose
// field breaks a limit above (the message names the type, field and limit).
// A decoded message is only well-formed: whether its sizes agree with what
// the sender declared at its handshake is checked where it is applied.
Result<Message> DecodeMessage(std::string_view bytes);

// Shared pieces, also used for bootstrap records.
std::string EncodeFailureRecord(const FailureRecord& record);
Result<FailureRecord> DecodeFailureRecord(std::string_view bytes);

}  // namespace kvbridge::internal
