// Fuzz target: DecodeMessage (connector/protocol.h), every control message
// type a peer can send: Hello, HelloAck, Meta, Notify, RoomFailed,
// Quiesced, Heartbeat, RankFailed, HelloChallenge, HelloProof.
//
// Checks: a rejected message says why; an accepted one re-encodes to a
// message of the same size that decodes again to the same encoding
// (encode(decode(x)) is a fixed point: only boolean bytes are normalised);
// and what the manager does first with a decoded message, under its mutex,
// stays cheap and well defined: the layout checks of a Hello, the flow
// planning and page checks of a Meta, the text of a failure record.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <variant>

#include "connector/protocol.h"
#include "engine/plan.h"

using namespace kvbridge;            // NOLINT: a fuzz target's own namespace
using namespace kvbridge::internal;  // NOLINT

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

// The receiving prefill rank: tp 4 of an 8-head MHA model, 2 layers.
RankLayout LocalLayout() {
  RankLayout l;
  l.page_size = 16;
  l.dtype = "bfloat16";
  l.tp_size = 4;
  l.tp_rank = 1;
  l.total_kv_heads = 8;
  l.kv_heads = 2;
  l.start_layer = 0;
  l.end_layer = 2;
  for (int i = 0; i < 4; ++i) l.kv.push_back({0x100000u * (i + 1), 64 * 4096, 4096});
  l.aux.push_back({0x900000, 64 * 64, 64});
  return l;
}

void Apply(const Message& m) {
  static const RankLayout local = LocalLayout();
  (void)m.from.ToString();
  if (const auto* hello = std::get_if<HelloMsg>(&m.body)) {
    (void)CheckLayout(hello->layout);
    (void)CheckCompatible(local, hello->layout);
  } else if (const auto* meta = std::get_if<MetaMsg>(&m.body)) {
    Check(meta->decode_tp_size >= 1 && meta->decode_tp_size <= kMaxParallelSize);
    auto flows = ComputeFlows(local.tp_size, meta->decode_tp_size, local.total_kv_heads, false);
    Check(flows.ok() && flows->size() <= static_cast<size_t>(meta->decode_tp_size) *
                                             static_cast<size_t>(local.total_kv_heads));
    (void)CheckPageIndices(local, meta->pages, /*unique=*/true);
  } else if (const auto* failed = std::get_if<RoomFailedMsg>(&m.body)) {
    (void)failed->record.Message();
    (void)failed->record.ToStatus();
  } else if (const auto* rank = std::get_if<RankFailedMsg>(&m.body)) {
    (void)rank->record.Message();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  Result<Message> m = DecodeMessage(in);
  if (!m.ok()) {
    Check(m.status().code() == StatusCode::kInvalidArgument && !m.status().message().empty());
    return 0;
  }
  const std::string again = EncodeMessage(m->from, m->body);
  Check(again.size() == in.size());
  Result<Message> m2 = DecodeMessage(again);
  Check(m2.ok() && m2->body.index() == m->body.index());
  Check(EncodeMessage(m2->from, m2->body) == again);
  Apply(*m);
  return 0;
}
