#include "connector/protocol.h"

#include <chrono>

#include "common/wire.h"

namespace kvbridge::internal {
namespace {

constexpr uint32_t kMagic = 0x4b56424d;  // "KVBM"

void PutRank(WireWriter& w, const RankId& r) {
  w.U8(static_cast<uint8_t>(r.role));
  w.I64(r.dp);
  w.I64(r.tp);
  w.I64(r.pp);
  w.I64(r.cp);
  w.Bytes(r.host);
  w.I64(r.pid);
  w.U64(r.incarnation);
  w.Bytes(r.instance);
}
bool GetInt(WireReader& r, int* v) {
  int64_t x;
  if (!r.I64(&x)) return false;
  *v = static_cast<int>(x);
  return true;
}
bool GetRank(WireReader& rd, RankId* r) {
  uint8_t role;
  if (!rd.U8(&role) || role > static_cast<uint8_t>(Role::kBootstrap)) return false;
  r->role = static_cast<Role>(role);
  return GetInt(rd, &r->dp) && GetInt(rd, &r->tp) && GetInt(rd, &r->pp) && GetInt(rd, &r->cp) &&
         rd.Bytes(&r->host) && GetInt(rd, &r->pid) && rd.U64(&r->incarnation) &&
         rd.Bytes(&r->instance);
}

void PutInts(WireWriter& w, const std::vector<int32_t>& v) {
  w.U32(static_cast<uint32_t>(v.size()));
  for (int32_t x : v) w.U32(static_cast<uint32_t>(x));
}
bool GetInts(WireReader& r, std::vector<int32_t>* v) {
  uint32_t n;
  if (!r.U32(&n) || n > r.remaining() / 4) return false;
  v->resize(n);
  for (auto& x : *v) {
    uint32_t u;
    if (!r.U32(&u)) return false;
    x = static_cast<int32_t>(u);
  }
  return true;
}
void PutStrings(WireWriter& w, const std::vector<std::string>& v) {
  w.U32(static_cast<uint32_t>(v.size()));
  for (const auto& s : v) w.Bytes(s);
}
bool GetStrings(WireReader& r, std::vector<std::string>* v) {
  uint32_t n;
  if (!r.U32(&n) || n > r.remaining() / 4) return false;
  v->resize(n);
  for (auto& s : *v)
    if (!r.Bytes(&s)) return false;
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
bool GetSpans(WireReader& r, std::vector<BufferSpan>* v) {
  uint32_t n;
  if (!r.U32(&n) || n > r.remaining() / 24) return false;
  v->resize(n);
  for (auto& b : *v)
    if (!r.U64(&b.addr) || !r.U64(&b.length) || !r.U64(&b.item_len)) return false;
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
}
bool GetLayout(WireReader& r, RankLayout* l) {
  uint8_t mla;
  if (!r.U8(&mla)) return false;
  l->is_mla = mla != 0;
  return GetInt(r, &l->page_size) && r.Bytes(&l->dtype) && GetInt(r, &l->tp_size) &&
         GetInt(r, &l->tp_rank) && GetInt(r, &l->total_kv_heads) && GetInt(r, &l->kv_heads) &&
         GetInt(r, &l->start_layer) && GetInt(r, &l->end_layer) && GetSpans(r, &l->kv) &&
         GetSpans(r, &l->aux) && GetSpans(r, &l->state);
}
int64_t Micros(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}
std::chrono::system_clock::time_point FromMicros(int64_t us) {
  return std::chrono::system_clock::time_point(std::chrono::microseconds(us));
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
  uint8_t cause, phase, other;
  int64_t at, last;
  if (!r.U64(&f->room) || !r.U64(&f->generation) || !GetRank(r, &f->origin) || !r.U8(&cause) ||
      cause >= AllFailureCauses().size() || !r.Bytes(&f->detail) || !r.U8(&phase) ||
      phase > static_cast<uint8_t>(Phase::kDone) || !GetRank(r, &f->detected_by) ||
      !r.Bytes(&f->mechanism) || !r.I64(&at) || !r.I64(&last) || !r.Bytes(&f->hint) ||
      !r.U8(&other))
    return false;
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
  }
  void operator()(const HelloAckMsg& m) {
    w.U32(static_cast<uint32_t>(m.code));
    w.Bytes(m.message);
    w.Bytes(m.address);
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

bool DecodeBody(uint8_t type, WireReader& r, MessageBody* body) {
  switch (type) {
    case 0: {
      HelloMsg m;
      if (!GetLayout(r, &m.layout) || !GetInt(r, &m.tp_size) || !r.Bytes(&m.address) ||
          !GetStrings(r, &m.kv_keys) || !GetStrings(r, &m.aux_keys) ||
          !GetStrings(r, &m.state_keys))
        return false;
      *body = std::move(m);
      return true;
    }
    case 1: {
      HelloAckMsg m;
      uint32_t code;
      if (!r.U32(&code) || code > 15 || !r.Bytes(&m.message) || !r.Bytes(&m.address)) return false;
      m.code = static_cast<StatusCode>(code);
      *body = std::move(m);
      return true;
    }
    case 2: {
      MetaMsg m;
      uint8_t dummy;
      if (!r.U64(&m.room) || !r.U64(&m.generation) || !GetInt(r, &m.decode_tp_size) ||
          !r.U8(&dummy) || !GetInts(r, &m.pages) || !r.I64(&m.aux_index) || !GetInts(r, &m.state) ||
          !r.I64(&m.prefix_pages))
        return false;
      m.dummy = dummy != 0;
      *body = std::move(m);
      return true;
    }
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
  }
  return false;
}

}  // namespace

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
  uint32_t magic;
  uint8_t type;
  Message m;
  if (!r.U32(&magic) || magic != kMagic || !r.U8(&type) || !GetRank(r, &m.from) ||
      !DecodeBody(type, r, &m.body) || !r.AtEnd()) {
    return InvalidArgumentError("garbled control message of " + std::to_string(bytes.size()) +
                                " bytes");
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
  if (!r.CheckCrc() || !GetRecord(r, &f) || !r.AtEnd())
    return InvalidArgumentError("garbled failure record");
  return f;
}

}  // namespace kvbridge::internal
