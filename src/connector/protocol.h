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
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "engine/plan.h"
#include "kvbridge/errors.h"
#include "kvbridge/status.h"

namespace kvbridge::internal {

struct HelloMsg {
  RankLayout layout;
  int tp_size = 1;
  std::string address;  // transport address to answer on
  std::vector<std::string> kv_keys, aux_keys, state_keys;
};
struct HelloAckMsg {
  StatusCode code = StatusCode::kOk;
  std::string message;
  std::string address;
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

using MessageBody = std::variant<HelloMsg, HelloAckMsg, MetaMsg, NotifyMsg, RoomFailedMsg,
                                 QuiescedMsg, HeartbeatMsg, RankFailedMsg>;

struct Message {
  RankId from;
  MessageBody body;
};

std::string EncodeMessage(const RankId& from, const MessageBody& body);
// InvalidArgument for a truncated, garbled or unknown message.
Result<Message> DecodeMessage(std::string_view bytes);

// Shared pieces, also used for bootstrap records.
std::string EncodeFailureRecord(const FailureRecord& record);
Result<FailureRecord> DecodeFailureRecord(std::string_view bytes);

}  // namespace kvbridge::internal
