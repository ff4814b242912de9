#include "connector/protocol.h"

#include <fmt/format.h>

#include <chrono>
#include <climits>
#include <iterator>
#include <ratio>

#include "common/wire.h"

namespace kvbridge::internal {
namespace {

// The magic names the message format: a rank of a build whose format differs
// is told apart from garbage. "KVBN": RankId carries the boot id. "KVBO":
// the HelloProof carries its Hello (stateless challenges), and the
// heartbeat endpoint seals in a lane of its own. "KVBP": the Hello's
// address is tagged under the secret (HelloMsg::address_tag).
constexpr uint32_t kMagic = 0x4b564250;                          // "KVBP"
constexpr uint32_t kMagicBeforeBootId = 0x4b56424d;              // "KVBM"
constexpr uint32_t kMagicBeforeStatelessChallenge = 0x4b56424e;  // "KVBN"
constexpr uint32_t kMagicBeforeAddressTag = 0x4b56424f;          // "KVBO"

void PutRank(WireWriter& w, const RankId& r) {
  w.U8(static_cast<uint8_t>(r.role));
  w.I64(r.dp);
  w.I64(r.tp);
  w.I64(r.pp);
  w.I64(r.cp);
  w.Bytes(r.host);
  w.Bytes(r.boot_id);
  w.I64(r.pid);
  w.U64(r.incarnation);
  w.Bytes(r.instance);
}
bool GetRank(WireReader& rd, std::string_view what, RankId* r) {
  uint8_t role = 0;
  if (!rd.U8(&role)) return rd.Fail(fmt::format("{} missing", what));
  if (role > static_cast<uint8_t>(Role::kBootstrap))
    return rd.Fail(fmt::format("{} role {} unknown", what, role));
  r->role = static_cast<Role>(role);
  constexpr int64_t kLast = kMaxParallelSize - 1;
  return rd.Int("rank dp", &r->dp, 0, kLast) && rd.Int("rank tp", &r->tp, 0, kLast) &&
         rd.Int("rank pp", &r->pp, 0, kLast) && rd.Int("rank cp", &r->cp, 0, kLast) &&
         rd.BoundedBytes("rank host", &r->host, kMaxNameBytes) &&
         rd.BoundedBytes("rank boot id", &r->boot_id, kMaxNameBytes) &&
         rd.Int("rank pid", &r->pid, 0, INT_MAX) && rd.U64(&r->incarnation) &&
         rd.BoundedBytes("rank instance", &r->instance, kMaxNameBytes);
}

template <size_t N>
void PutFixed(WireWriter& w, const std::array<uint8_t, N>& a) {
  w.Bytes(std::string_view(reinterpret_cast<const char*>(a.data()), N));
}
template <size_t N>
bool GetFixed(WireReader& r, std::string_view what, std::array<uint8_t, N>* a) {
  std::string s;
  if (!r.BoundedBytes(what, &s, N)) return false;
  if (s.size() != N) return r.Fail(fmt::format("{} of {} bytes, not {}", what, s.size(), N));
  std::copy(s.begin(), s.end(), a->begin());
  return true;
}

void PutInts(WireWriter& w, const std::vector<int32_t>& v) {
  w.U32(static_cast<uint32_t>(v.size()));
  for (int32_t x : v) w.U32(static_cast<uint32_t>(x));
}
bool GetInts(WireReader& r, std::string_view what, std::vector<int32_t>* v) {
  uint32_t n;
  if (!r.Count(what, &n, 4, kMaxPagesPerMessage)) return false;
  v->resize(n);
  for (auto& x : *v) {
    uint32_t u;
    if (!r.U32(&u)) return false;  // cannot happen: Count checked the room left
    x = static_cast<int32_t>(u);
  }
  return true;
}
void PutStrings(WireWriter& w, const std::vector<std::string>& v) {
  w.U32(static_cast<uint32_t>(v.size()));
  for (const auto& s : v) w.Bytes(s);
}
bool GetStrings(WireReader& r, std::string_view what, std::vector<std::string>* v) {
  uint32_t n;
  if (!r.Count(what, &n, 4, kMaxBuffers)) return false;
  v->resize(n);
  for (auto& s : *v)
    if (!r.BoundedBytes(what, &s, kMaxBlobBytes)) return false;
  return true;
}
void PutSpans(WireWriter& w, const std::vector<BufferSpan>& v) {
  w.U32(static_cast<uint32_t>(v.size()));
  for (const auto& b : v) {
    w.U64(b.addr);
    w.U64(b.length);
    w.U64(b.item_len);
  }
}
bool GetSpans(WireReader& r, std::string_view what, std::vector<BufferSpan>* v) {
  uint32_t n;
  if (!r.Count(fmt::format("{} buffer count", what), &n, 24, kMaxBuffers)) return false;
  v->resize(n);
  for (size_t i = 0; i < v->size(); ++i) {
    BufferSpan& b = (*v)[i];
    if (!r.U64(&b.addr) || !r.U64(&b.length) || !r.U64(&b.item_len))
      return r.Fail(fmt::format("{}[{}] truncated", what, i));
    if (b.length > kMaxBufferBytes || b.item_len > b.length || b.addr > UINT64_MAX - b.length) {
      return r.Fail(
          fmt::format("{}[{}] of {} bytes at {:#x}, items of {}: past the limit of {} "
                      "bytes, longer than the buffer or wrapping",
                      what, i, b.length, b.addr, b.item_len, kMaxBufferBytes));
    }
  }
  return true;
}
void PutLayout(WireWriter& w, const RankLayout& l) {
  w.U8(l.is_mla ? 1 : 0);
  w.I64(l.page_size);
  w.Bytes(l.dtype);
  w.I64(l.tp_size);
  w.I64(l.tp_rank);
  w.I64(l.total_kv_heads);
  w.I64(l.kv_heads);
  w.I64(l.start_layer);
  w.I64(l.end_layer);
  PutSpans(w, l.kv);
  PutSpans(w, l.aux);
  PutSpans(w, l.state);
  w.U32(static_cast<uint32_t>(l.state_sharding.size()));
  for (const StateSharding& s : l.state_sharding) {
    w.U32(s.dim);
    w.U32(s.outer);
    w.U32(static_cast<uint32_t>(s.groups.size()));
    for (uint32_t g : s.groups) w.U32(g);
  }
  w.U32(static_cast<uint32_t>(l.kv_layer_ids.size()));
  for (int32_t id : l.kv_layer_ids) w.U32(static_cast<uint32_t>(id));
  w.U32(static_cast<uint32_t>(l.state_types.size()));
  for (int32_t t : l.state_types) w.U32(static_cast<uint32_t>(t));
  // Each id + 1: -1 (none) is 0.
  w.U32(static_cast<uint32_t>(l.state_layer_ids.size()));
  for (int32_t id : l.state_layer_ids) w.U32(static_cast<uint32_t>(int64_t{id} + 1));
  w.U32(static_cast<uint32_t>(l.state_type_names.size()));
  for (const std::string& name : l.state_type_names) w.Bytes(name);
  w.I64(l.dcp_size);
  w.I64(l.dcp_rank);
  w.I64(l.cp_size);
  w.U8(l.all_cp_ranks ? 1 : 0);
  w.I64(l.num_draft_entries);
  w.I64(l.pp_size);
}
// Layer ids: none, or one per kv buffer, each in [0, INT_MAX].
bool GetLayerIds(WireReader& r, RankLayout* l) {
  uint32_t n;
  if (!r.Count("kv layer id count", &n, 4, kMaxBuffers)) return false;
  if (n != 0 && n != l->kv.size())
    return r.Fail(fmt::format("{} kv layer ids, the layout has {} kv buffers", n, l->kv.size()));
  l->kv_layer_ids.resize(n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t id;
    if (!r.U32(&id)) return r.Fail(fmt::format("kv layer id [{}] truncated", i));
    if (id > static_cast<uint32_t>(INT32_MAX))
      return r.Fail(fmt::format("kv layer id [{}] is {}, past {}", i, id, INT32_MAX));
    l->kv_layer_ids[i] = static_cast<int32_t>(id);
  }
  return true;
}
// State types and state layer ids: each none, or one per state buffer; a
// type in [0, state buffers), an id in [-1, INT_MAX] (CheckLayout judges
// the rest).
bool GetStateMeta(WireReader& r, RankLayout* l) {
  const uint32_t buffers = static_cast<uint32_t>(l->state.size());
  uint32_t n;
  if (!r.Count("state type count", &n, 4, kMaxBuffers)) return false;
  if (n != 0 && n != buffers)
    return r.Fail(fmt::format("{} state types, the layout has {} state buffers", n, buffers));
  l->state_types.resize(n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t t;
    if (!r.U32In(fmt::format("state type [{}]", i), &t, 0, buffers - 1)) return false;
    l->state_types[i] = static_cast<int32_t>(t);
  }
  if (!r.Count("state layer id count", &n, 4, kMaxBuffers)) return false;
  if (n != 0 && n != buffers)
    return r.Fail(fmt::format("{} state layer ids, the layout has {} state buffers", n, buffers));
  l->state_layer_ids.resize(n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t v;
    if (!r.U32In(fmt::format("state layer id [{}] + 1", i), &v, 0, uint32_t{INT32_MAX} + 1))
      return false;
    l->state_layer_ids[i] = static_cast<int32_t>(int64_t{v} - 1);
  }
  // Type names: at most one per state buffer (CheckLayout: one per type).
  if (!r.Count("state type name count", &n, 4, kMaxBuffers)) return false;
  if (n > buffers)
    return r.Fail(fmt::format("{} state type names, the layout has {} state buffers", n, buffers));
  l->state_type_names.resize(n);
  for (size_t i = 0; i < n; ++i)
    if (!r.BoundedBytes(fmt::format("state type name [{}]", i), &l->state_type_names[i],
                        kMaxStateTypeName))
      return false;
  return true;
}
// State sharding: none, or one entry per state buffer (CheckLayout judges
// the values).
bool GetSharding(WireReader& r, RankLayout* l) {
  uint32_t n;
  if (!r.Count("state sharding count", &n, 12, kMaxBuffers)) return false;
  if (n != 0 && n != l->state.size())
    return r.Fail(fmt::format("state sharding for {} buffers, the layout has {} state buffers", n,
                              l->state.size()));
  l->state_sharding.resize(n);
  for (size_t i = 0; i < n; ++i) {
    StateSharding& s = l->state_sharding[i];
    uint32_t groups;
    if (!r.U32(&s.dim) || !r.U32(&s.outer) ||
        !r.Count(fmt::format("state[{}] sub-block count", i), &groups, 4, kMaxStateGroups))
      return r.Fail(fmt::format("state sharding [{}] truncated", i));
    s.groups.resize(groups);
    for (uint32_t& g : s.groups)
      if (!r.U32(&g)) return r.Fail(fmt::format("state sharding [{}] truncated", i));
  }
  return true;
}
// A flag is one byte, 0 or 1.
bool GetFlag(WireReader& r, std::string_view what, bool* v) {
  uint8_t b;
  if (!r.U8(&b)) return r.Fail(fmt::format("{} missing", what));
  if (b > 1) return r.Fail(fmt::format("{} is {}, not 0 or 1", what, b));
  *v = b == 1;
  return true;
}
// Only bounds here: whether the layout is consistent and fits ours is
// CheckCompatible's verdict, which the HelloAck carries back to the peer.
bool GetLayout(WireReader& r, RankLayout* l) {
  uint8_t mla;
  if (!r.U8(&mla)) return r.Fail("layout missing");
  l->is_mla = mla != 0;
  return r.Int("page_size", &l->page_size, 0, INT_MAX) &&
         r.BoundedBytes("dtype", &l->dtype, kMaxNameBytes) &&
         r.Int("layout tp_size", &l->tp_size, 1, kMaxParallelSize) &&
         r.Int("layout tp_rank", &l->tp_rank, 0, kMaxParallelSize - 1) &&
         r.Int("total_kv_heads", &l->total_kv_heads, 0, INT_MAX) &&
         r.Int("kv_heads", &l->kv_heads, 0, INT_MAX) &&
         r.Int("start_layer", &l->start_layer, 0, INT_MAX) &&
         r.Int("end_layer", &l->end_layer, 0, INT_MAX) && GetSpans(r, "kv", &l->kv) &&
         GetSpans(r, "aux", &l->aux) && GetSpans(r, "state", &l->state) && GetSharding(r, l) &&
         GetLayerIds(r, l) && GetStateMeta(r, l) &&
         r.Int("dcp_size", &l->dcp_size, 1, kMaxParallelSize) &&
         r.Int("dcp_rank", &l->dcp_rank, 0, kMaxParallelSize - 1) &&
         r.Int("layout cp_size", &l->cp_size, 1, kMaxParallelSize) &&
         GetFlag(r, "all_cp_ranks", &l->all_cp_ranks) &&
         r.Int("num_draft_entries", &l->num_draft_entries, 0, static_cast<int>(l->kv.size())) &&
         r.Int("layout pp_size", &l->pp_size, 1, kMaxParallelSize);
}
int64_t Micros(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}
// Precondition: 0 <= us <= kMaxTimestampMicros (GetRecord checks).
std::chrono::system_clock::time_point FromMicros(int64_t us) {
  static_assert(std::ratio_less_equal_v<std::chrono::system_clock::period, std::micro> &&
                    std::chrono::system_clock::period::den <= 1'000'000'000,
                "kMaxTimestampMicros assumes a clock tick between 1 ns and 1 us");
  return std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::microseconds(us)));
}
void PutRecord(WireWriter& w, const FailureRecord& f) {
  w.U64(f.room);
  w.U64(f.generation);
  PutRank(w, f.origin);
  w.U8(static_cast<uint8_t>(f.cause));
  w.Bytes(f.detail);
  w.U8(static_cast<uint8_t>(f.phase));
  PutRank(w, f.detected_by);
  w.Bytes(f.mechanism);
  w.I64(Micros(f.detected_at));
  w.I64(Micros(f.last_sign_of_life));
  w.Bytes(f.hint);
  w.U8(f.is_from_another_rank ? 1 : 0);
}
bool GetRecord(WireReader& r, FailureRecord* f) {
  uint8_t cause = 0, phase = 0, other = 0;
  int64_t at = 0, last = 0;
  if (!r.U64(&f->room) || !r.U64(&f->generation) || !GetRank(r, "record origin", &f->origin) ||
      !r.U8(&cause))
    return r.Fail("record truncated");
  if (cause >= AllFailureCauses().size())
    return r.Fail(fmt::format("record cause {} unknown", cause));
  if (!r.BoundedBytes("record detail", &f->detail, kMaxTextBytes)) return false;
  if (!r.U8(&phase)) return r.Fail("record truncated");
  if (phase > static_cast<uint8_t>(Phase::kDone))
    return r.Fail(fmt::format("record phase {} unknown", phase));
  if (!GetRank(r, "record detected_by", &f->detected_by) ||
      !r.BoundedBytes("record mechanism", &f->mechanism, kMaxTextBytes) ||
      !r.I64In("record detected_at", &at, 0, kMaxTimestampMicros) ||
      !r.I64In("record last_sign_of_life", &last, 0, kMaxTimestampMicros) ||
      !r.BoundedBytes("record hint", &f->hint, kMaxTextBytes) || !r.U8(&other))
    return r.Fail("record truncated");
  f->cause = static_cast<FailureCause>(cause);
  f->phase = static_cast<Phase>(phase);
  f->detected_at = FromMicros(at);
  f->last_sign_of_life = FromMicros(last);
  f->is_from_another_rank = other != 0;
  return true;
}

struct Encoder {
  WireWriter& w;
  void operator()(const HelloMsg& m) {
    PutLayout(w, m.layout);
    w.I64(m.tp_size);
    w.Bytes(m.address);
    PutStrings(w, m.kv_keys);
    PutStrings(w, m.aux_keys);
    PutStrings(w, m.state_keys);
    w.U64(m.session);
    PutFixed(w, m.nonce);
    PutFixed(w, m.address_tag);
  }
  void operator()(const HelloChallengeMsg& m) {
    w.U64(m.decode_session);
    w.U64(m.session);
    PutFixed(w, m.nonce);
    PutFixed(w, m.proof);
  }
  void operator()(const HelloProofMsg& m) {
    w.U64(m.session);
    PutFixed(w, m.proof);
    w.Bytes(m.hello);
  }
  void operator()(const HelloAckMsg& m) {
    w.U32(static_cast<uint32_t>(m.code));
    w.Bytes(m.message);
    w.Bytes(m.address);
    w.Bytes(m.path);
  }
  void operator()(const MetaMsg& m) {
    w.U64(m.room);
    w.U64(m.generation);
    w.I64(m.decode_tp_size);
    w.U8(m.dummy ? 1 : 0);
    PutInts(w, m.pages);
    w.I64(m.aux_index);
    PutInts(w, m.state);
    w.I64(m.prefix_pages);
  }
  void operator()(const NotifyMsg& m) {
    w.U64(m.room);
    w.U64(m.generation);
    w.U32(m.chunk);
    w.U8(m.last ? 1 : 0);
    w.U32(m.pages);
  }
  void operator()(const RoomFailedMsg& m) {
    w.U64(m.room);
    w.U64(m.generation);
    w.U8(m.quiesced ? 1 : 0);
    PutRecord(w, m.record);
  }
  void operator()(const QuiescedMsg& m) {
    w.U64(m.room);
    w.U64(m.generation);
  }
  void operator()(const HeartbeatMsg& m) { w.U64(m.seq); }
  void operator()(const RankFailedMsg& m) { PutRecord(w, m.record); }
};

bool CheckKeys(WireReader& r, std::string_view what, size_t keys, size_t buffers) {
  if (keys == buffers) return true;
  return r.Fail(fmt::format("{} {} keys for {} buffers", keys, what, buffers));
}

bool DecodeHello(WireReader& r, MessageBody* body) {
  HelloMsg m;
  if (!GetLayout(r, &m.layout) || !r.Int("tp_size", &m.tp_size, 1, kMaxParallelSize) ||
      !r.BoundedBytes("address", &m.address, kMaxBlobBytes) ||
      !GetStrings(r, "kv keys", &m.kv_keys) || !GetStrings(r, "aux keys", &m.aux_keys) ||
      !GetStrings(r, "state keys", &m.state_keys) || !r.U64(&m.session) ||
      !GetFixed(r, "nonce", &m.nonce) || !GetFixed(r, "address tag", &m.address_tag))
    return false;
  // A Hello describes one rank: its tp size is its layout's, and it has one
  // remote key per buffer it declares.
  if (m.tp_size != m.layout.tp_size) {
    return r.Fail(fmt::format("tp_size {} disagrees with the layout's tp_size {}", m.tp_size,
                              m.layout.tp_size));
  }
  if (m.layout.tp_rank >= m.layout.tp_size) {
    return r.Fail(
        fmt::format("layout tp_rank {} out of range [0, {})", m.layout.tp_rank, m.layout.tp_size));
  }
  if (!CheckKeys(r, "kv", m.kv_keys.size(), m.layout.kv.size()) ||
      !CheckKeys(r, "aux", m.aux_keys.size(), m.layout.aux.size()) ||
      !CheckKeys(r, "state", m.state_keys.size(), m.layout.state.size()))
    return false;
  *body = std::move(m);
  return true;
}

bool DecodeMeta(WireReader& r, MessageBody* body) {
  MetaMsg m;
  uint8_t dummy = 0;
  if (!r.U64(&m.room) || !r.U64(&m.generation)) return r.Fail("room missing");
  if (!r.Int("decode_tp_size", &m.decode_tp_size, 1, kMaxParallelSize) || !r.U8(&dummy) ||
      !GetInts(r, "page count", &m.pages) || !r.I64In("aux_index", &m.aux_index, -1, INT32_MAX) ||
      !GetInts(r, "state slot count", &m.state) ||
      !r.I64In("prefix_pages", &m.prefix_pages, 0, INT32_MAX))
    return false;
  m.dummy = dummy != 0;
  *body = std::move(m);
  return true;
}

bool DecodeBody(uint8_t type, WireReader& r, MessageBody* body) {
  switch (type) {
    case 0:
      return DecodeHello(r, body);
    case 1: {
      HelloAckMsg m;
      uint32_t code;
      if (!r.U32In("status code", &code, 0, static_cast<uint32_t>(StatusCode::kDataLoss)) ||
          !r.BoundedBytes("message", &m.message, kMaxTextBytes) ||
          !r.BoundedBytes("address", &m.address, kMaxBlobBytes) ||
          // Required: an optional trailing field would not re-encode to the
          // bytes received (the control_message fuzz target's fixed point).
          !r.BoundedBytes("path", &m.path, kMaxNameBytes))
        return false;
      m.code = static_cast<StatusCode>(code);
      *body = std::move(m);
      return true;
    }
    case 2:
      return DecodeMeta(r, body);
    case 3: {
      NotifyMsg m;
      uint8_t last;
      if (!r.U64(&m.room) || !r.U64(&m.generation) || !r.U32(&m.chunk) || !r.U8(&last) ||
          !r.U32(&m.pages))
        return false;
      m.last = last != 0;
      *body = m;
      return true;
    }
    case 4: {
      RoomFailedMsg m;
      uint8_t q;
      if (!r.U64(&m.room) || !r.U64(&m.generation) || !r.U8(&q) || !GetRecord(r, &m.record))
        return false;
      m.quiesced = q != 0;
      *body = std::move(m);
      return true;
    }
    case 5: {
      QuiescedMsg m;
      if (!r.U64(&m.room) || !r.U64(&m.generation)) return false;
      *body = m;
      return true;
    }
    case 6: {
      HeartbeatMsg m;
      if (!r.U64(&m.seq)) return false;
      *body = m;
      return true;
    }
    case 7: {
      RankFailedMsg m;
      if (!GetRecord(r, &m.record)) return false;
      *body = std::move(m);
      return true;
    }
    case 8: {
      HelloChallengeMsg m;
      if (!r.U64(&m.decode_session) || !r.U64(&m.session) || !GetFixed(r, "nonce", &m.nonce) ||
          !GetFixed(r, "proof", &m.proof))
        return r.Fail("challenge truncated");
      *body = m;
      return true;
    }
    case 9: {
      HelloProofMsg m;
      if (!r.U64(&m.session) || !GetFixed(r, "proof", &m.proof)) return r.Fail("proof truncated");
      if (!r.BoundedBytes("the Hello a proof answers", &m.hello, kMaxHelloBytes)) return false;
      *body = m;
      return true;
    }
  }
  return r.Fail(fmt::format("unknown message type {}", type));
}

// A Hello describes its sender's own rank.
bool HelloMatchesSender(const Message& m, WireReader& r) {
  const auto* hello = std::get_if<HelloMsg>(&m.body);
  if (hello == nullptr || hello->layout.tp_rank == m.from.tp) return true;
  return r.Fail(
      fmt::format("layout tp_rank {} is not the sender's tp {}", hello->layout.tp_rank, m.from.tp));
}

constexpr std::string_view kTypeNames[] = {"Hello",          "HelloAck",  "Meta",      "Notify",
                                           "RoomFailed",     "Quiesced",  "Heartbeat", "RankFailed",
                                           "HelloChallenge", "HelloProof"};
static_assert(std::size(kTypeNames) == std::variant_size_v<MessageBody>);

}  // namespace

std::string_view MessageTypeName(const MessageBody& body) { return kTypeNames[body.index()]; }

std::string EncodeMessage(const RankId& from, const MessageBody& body) {
  WireWriter w;
  w.U32(kMagic);
  w.U8(static_cast<uint8_t>(body.index()));
  PutRank(w, from);
  std::visit(Encoder{w}, body);
  return w.Finish();
}

Result<Message> DecodeMessage(std::string_view bytes) {
  WireReader r(bytes);
  uint32_t magic = 0;
  uint8_t type = 0xff;
  Message m;
  auto bad_magic = [&] {
    const char* older = magic == kMagicBeforeBootId ? "no boot id in a rank"
                        : magic == kMagicBeforeStatelessChallenge
                            ? "a handshake whose proof does not carry its Hello"
                        : magic == kMagicBeforeAddressTag ? "a Hello whose address is not tagged"
                                                          : nullptr;
    if (older == nullptr) return r.Fail(fmt::format("bad magic {:#x}", magic));
    return r.Fail(
        fmt::format("from a kvbridge build of an older message format ({}): upgrade "
                    "every rank of the deployment together",
                    older));
  };
  bool ok = r.U32(&magic) && (magic == kMagic || bad_magic()) && r.U8(&type) &&
            GetRank(r, "sender", &m.from) && DecodeBody(type, r, &m.body) &&
            HelloMatchesSender(m, r) &&
            (r.AtEnd() || r.Fail(fmt::format("{} bytes after the end", r.remaining())));
  if (!ok) {
    std::string_view name = type < std::size(kTypeNames) ? kTypeNames[type] : "unknown";
    return InvalidArgumentError(
        fmt::format("garbled control message ({}) of {} bytes: {}", name, bytes.size(), r.error()));
  }
  return m;
}

std::string EncodeFailureRecord(const FailureRecord& record) {
  WireWriter w;
  PutRecord(w, record);
  return w.FinishWithCrc();
}

Result<FailureRecord> DecodeFailureRecord(std::string_view bytes) {
  WireReader r(bytes);
  FailureRecord f;
  if (!r.CheckCrc()) return InvalidArgumentError("garbled failure record: bad checksum");
  if (!GetRecord(r, &f) ||
      (!r.AtEnd() && !r.Fail(fmt::format("{} bytes after the end", r.remaining())))) {
    return InvalidArgumentError("garbled failure record: " + r.error());
  }
  return f;
}

}  // namespace kvbridge::internal
