#include "control/etcd_view.h"

#include <charconv>
#include <cinttypes>
#include <cstdio>

#include "common/log.h"
#include "control/json_fields.h"
#include "control/record_json.h"

namespace kvbridge::internal {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

// The largest value a rank or failure key may hold (a record is a few KiB).
constexpr size_t kMaxValueBytes = size_t{1} << 20;

bool ParseUint(std::string_view text, uint64_t* out) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return !text.empty() && ec == std::errc() && end == text.data() + text.size();
}

// "dp3" -> 3 (0 .. 2^20).
bool ParseRankPart(std::string_view part, std::string_view name, int* out) {
  uint64_t v = 0;
  if (part.substr(0, name.size()) != name || !ParseUint(part.substr(name.size()), &v) ||
      v > (1u << 20)) {
    return false;
  }
  *out = static_cast<int>(v);
  return true;
}

struct RankPath {
  RankRole role = RankRole::kPrefill;
  RankKey key;
  uint64_t incarnation = 0;  // decode only
};

std::optional<RankPath> ParseRankPath(std::string_view path) {
  std::vector<std::string_view> parts;
  for (size_t start = 0;;) {
    size_t slash = path.find('/', start);
    parts.push_back(path.substr(start, slash == path.npos ? path.npos : slash - start));
    if (slash == path.npos) break;
    start = slash + 1;
  }
  RankPath p;
  if (parts[0] == "prefill" && parts.size() == 5) {
    p.role = RankRole::kPrefill;
  } else if (parts[0] == "decode" && parts.size() == 6) {
    p.role = RankRole::kDecode;
    if (!ParseUint(parts[5], &p.incarnation) || p.incarnation == 0) return std::nullopt;
  } else {
    return std::nullopt;
  }
  if (!ParseRankPart(parts[1], "dp", &p.key.dp) || !ParseRankPart(parts[2], "cp", &p.key.cp) ||
      !ParseRankPart(parts[3], "tp", &p.key.tp) || !ParseRankPart(parts[4], "pp", &p.key.pp)) {
    return std::nullopt;
  }
  return p;
}

}  // namespace

std::string EtcdRankPath(RankRole role, const RankKey& k, uint64_t incarnation) {
  std::string path = std::string(RankRoleName(role)) + "/dp" + std::to_string(k.dp) + "/cp" +
                     std::to_string(k.cp) + "/tp" + std::to_string(k.tp) + "/pp" +
                     std::to_string(k.pp);
  if (role == RankRole::kDecode) path += "/" + std::to_string(incarnation);
  return path;
}

std::string EtcdSeqKey(uint64_t seq) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%020" PRIu64, seq);
  return buf;
}

std::string EncodeEtcdRank(const EtcdSeal& seal, std::string_view key, const RankRecord& record,
                           milliseconds unresponsive_ttl, milliseconds dead_ttl) {
  return seal.Seal(key, json{{"schema", kEtcdSchemaVersion},
                             {"record", record.ToJson()},
                             {"unresponsive_ttl_ms", unresponsive_ttl.count()},
                             {"dead_ttl_ms", dead_ttl.count()}});
}

std::string EncodeEtcdAlive(const EtcdSeal& seal, std::string_view key, uint64_t incarnation) {
  return seal.Seal(key, json{{"schema", kEtcdSchemaVersion}, {"incarnation", incarnation}});
}

std::string EncodeEtcdFailure(const EtcdSeal& seal, std::string_view key, uint64_t seq,
                              const json& record) {
  return seal.Seal(key, json{{"schema", kEtcdSchemaVersion}, {"seq", seq}, {"record", record}});
}

EtcdView::EtcdView(std::string prefix, EtcdSeal seal, milliseconds forget_decode_after)
    : prefix_(std::move(prefix)),
      seal_(std::move(seal)),
      forget_decode_after_(forget_decode_after) {}

Result<json> EtcdView::Read(const std::string& key, const std::string& value) const {
  const std::string what = "etcd key " + Clip(key, 120);
  KVB_ASSIGN_OR_RETURN(json j, ParseJson(value, what, kMaxValueBytes));
  JsonFields f(j, what);
  KVB_RETURN_IF_ERROR(f.RequireObject());
  int64_t schema = 0;
  KVB_RETURN_IF_ERROR(f.Int("schema", int64_t{0}, int64_t{1} << 30, &schema));
  if (schema != kEtcdSchemaVersion) {
    return InvalidArgumentError(what + " has schema version " + std::to_string(schema) +
                                "; this build reads version " + std::to_string(kEtcdSchemaVersion) +
                                " (a newer or older kvbridge wrote it)");
  }
  KVB_RETURN_IF_ERROR(seal_.Open(key, j));
  return j;
}

void EtcdView::Problem(const std::string& key, const std::string& why) {
  auto [it, inserted] = problems_.insert_or_assign(key, why);
  if (inserted) KVB_LOG_WARN("etcd registry: not using key {}: {}", Clip(key, 160), why);
}

EtcdView::Entry* EtcdView::Find(const std::string& path) {
  std::optional<RankPath> p = ParseRankPath(path);
  if (!p) return nullptr;
  if (p->role == RankRole::kPrefill) {
    auto it = prefill_.find(p->key);
    return it == prefill_.end() ? nullptr : &it->second;
  }
  auto it = decode_.find({p->key, p->incarnation});
  return it == decode_.end() ? nullptr : &it->second;
}

void EtcdView::Reset(const std::vector<EtcdKv>& kvs, Time now) {
  for (auto& [k, e] : prefill_) e.present = false;
  for (auto& [k, e] : decode_) e.present = false;
  std::map<std::string, uint64_t> alive_before;
  alive_before.swap(alive_);
  failures_.clear();
  problems_.clear();
  prefill_problems_.clear();
  for (const EtcdKv& kv : kvs) Apply(EtcdEvent{false, kv}, now);
  for (auto& [k, e] : prefill_)
    if (!e.present && e.deleted_at == Time{}) e.deleted_at = now;
  for (auto& [k, e] : decode_)
    if (!e.present && e.deleted_at == Time{}) e.deleted_at = now;
  for (const auto& [path, inc] : alive_before)
    if (!alive_.contains(path)) alive_lost_[path] = now;
}

void EtcdView::Apply(const EtcdEvent& ev, Time now) {
  const std::string& key = ev.kv.key;
  if (key.compare(0, prefix_.size(), prefix_) != 0) return;
  const std::string rest = key.substr(prefix_.size());
  if (rest.starts_with("ranks/")) {
    ApplyRank(rest.substr(6), ev, now);
  } else if (rest.starts_with("alive/")) {
    ApplyAlive(rest.substr(6), ev, now);
  } else if (rest.starts_with("failures/")) {
    ApplyFailure(rest.substr(9), ev);
  }
  Forget(now);
}

void EtcdView::ApplyRank(const std::string& path, const EtcdEvent& ev, Time now) {
  const std::string& key = ev.kv.key;
  std::optional<RankPath> p = ParseRankPath(path);
  if (!p) {
    if (!ev.is_delete)
      Problem(key, "not a rank position (prefill/dpD/cpC/tpT/ppP or decode/.../INC)");
    return;
  }
  if (ev.is_delete) {
    problems_.erase(key);
    if (p->role == RankRole::kPrefill) prefill_problems_.erase(p->key);
    if (Entry* e = Find(path); e != nullptr && e->present) {
      e->present = false;
      e->deleted_at = now;
    }
    return;
  }
  Status bad;
  RankRecord record;
  Result<json> j = Read(key, ev.kv.value);
  int64_t unresponsive_ms = 0, dead_ms = 0;
  if (!j.ok()) {
    bad = j.status();
  } else {
    JsonFields f(*j, "etcd key " + Clip(key, 120));
    json r;
    bad = f.Object("record", &r);
    if (bad.ok())
      bad = f.Int("unresponsive_ttl_ms", int64_t{0}, int64_t{1} << 40, &unresponsive_ms);
    if (bad.ok()) bad = f.Int("dead_ttl_ms", int64_t{0}, int64_t{1} << 40, &dead_ms);
    if (bad.ok()) {
      Result<RankRecord> rr = RankRecord::FromJson(r);
      bad = rr.ok() ? rr->Validate() : rr.status();
      if (rr.ok()) record = std::move(rr).value();
    }
    if (bad.ok() && (record.role != p->role || record.key() != p->key ||
                     (p->role == RankRole::kDecode && record.incarnation != p->incarnation))) {
      bad = InvalidArgumentError("holds the record of " + record.Describe() +
                                 ", not of the position its key names");
    }
  }
  if (!bad.ok()) {
    Problem(key, bad.message());
    if (p->role == RankRole::kPrefill) prefill_problems_[p->key] = key + ": " + bad.message();
    return;
  }
  problems_.erase(key);
  Entry* e = nullptr;
  if (p->role == RankRole::kPrefill) {
    prefill_problems_.erase(p->key);
    auto [it, inserted] = prefill_.try_emplace(p->key);
    e = &it->second;
    if (!inserted && e->record.incarnation != record.incarnation) ++e->restarts;
  } else {
    e = &decode_[{p->key, p->incarnation}];
  }
  e->record = std::move(record);
  e->present = true;
  e->deleted_at = Time{};
  e->unresponsive_ttl = milliseconds(unresponsive_ms);
  e->dead_ttl = milliseconds(dead_ms);
}

void EtcdView::ApplyAlive(const std::string& path, const EtcdEvent& ev, Time now) {
  if (ev.is_delete) {
    problems_.erase(ev.kv.key);
    if (alive_.erase(path) != 0) alive_lost_[path] = now;
    return;
  }
  Result<json> j = Read(ev.kv.key, ev.kv.value);
  uint64_t inc = 0;
  Status s = j.ok() ? JsonFields(*j, "etcd key " + Clip(ev.kv.key, 120)).Uint64("incarnation", &inc)
                    : j.status();
  if (!s.ok() || !ParseRankPath(path)) {
    Problem(ev.kv.key, s.ok() ? "not a rank position" : s.message());
    return;
  }
  problems_.erase(ev.kv.key);
  alive_[path] = inc;
  alive_lost_.erase(path);
}

void EtcdView::ApplyFailure(const std::string& name, const EtcdEvent& ev) {
  uint64_t seq = 0;
  if (!ParseUint(name, &seq) || seq == 0) {
    if (!ev.is_delete) Problem(ev.kv.key, "not a failure sequence number");
    return;
  }
  if (ev.is_delete) {  // trimmed: the oldest records go
    problems_.erase(ev.kv.key);
    failures_.erase(seq);
    return;
  }
  Result<json> j = Read(ev.kv.key, ev.kv.value);
  Status s = j.status();
  uint64_t stored_seq = 0;
  json record;
  Result<FailureRecord> parsed = InvalidArgumentError("unread");
  if (s.ok()) {
    JsonFields f(*j, "etcd key " + Clip(ev.kv.key, 120));
    s = f.Uint64("seq", &stored_seq);
    if (s.ok()) s = f.Object("record", &record);
    if (s.ok() && stored_seq != seq) {
      s = InvalidArgumentError("holds seq " + std::to_string(stored_seq) + ", its key says " +
                               std::to_string(seq));
    }
    if (s.ok()) {
      parsed = FailureRecordFromJson(record);
      s = parsed.status();
    }
  }
  if (!s.ok()) {
    Problem(ev.kv.key, s.message());
    return;
  }
  problems_.erase(ev.kv.key);
  json canonical = FailureRecordToJson(*parsed);
  canonical["seq"] = seq;
  failures_[seq] = Stored{std::move(canonical), std::move(parsed).value()};
  latest_seq_ = std::max(latest_seq_, seq);
}

void EtcdView::Forget(Time now) {
  std::erase_if(decode_, [&](const auto& kv) {
    return !kv.second.present && now - kv.second.deleted_at > forget_decode_after_;
  });
  // A bounded picture whatever the store holds: the oldest deleted decode
  // ranks go first.
  while (decode_.size() > 4096) {
    auto oldest = decode_.end();
    for (auto it = decode_.begin(); it != decode_.end(); ++it)
      if (!it->second.present &&
          (oldest == decode_.end() || it->second.deleted_at < oldest->second.deleted_at))
        oldest = it;
    if (oldest == decode_.end()) break;
    decode_.erase(oldest);
  }
  while (alive_lost_.size() > 8192) alive_lost_.erase(alive_lost_.begin());
  while (failures_.size() > 4096) failures_.erase(failures_.begin());
}

uint64_t EtcdView::DeadBySeq(RankRole role, const RankKey& key, uint64_t incarnation) const {
  for (const auto& [seq, s] : failures_) {
    const RankId& o = s.parsed.origin;
    if (o.role == Role::kBootstrap || !IsRankFailure(s.parsed.cause)) continue;
    if ((o.role == Role::kPrefill) != (role == RankRole::kPrefill)) continue;
    if (RankKey{o.dp, o.cp, o.tp, o.pp} != key) continue;
    if (o.incarnation != 0 && o.incarnation != incarnation) continue;
    return seq;
  }
  return 0;
}

std::optional<uint64_t> EtcdView::HolderOf(RankRole role, const RankKey& key,
                                           uint64_t incarnation) const {
  if (role == RankRole::kPrefill) {
    auto it = prefill_.find(key);
    if (it == prefill_.end() || !it->second.present) return std::nullopt;
    return it->second.record.incarnation;
  }
  auto it = decode_.find({key, incarnation});
  if (it == decode_.end() || !it->second.present) return std::nullopt;
  return incarnation;
}

RankStatus EtcdView::StatusOf(const std::string& path, const Entry& e, Time now) const {
  RankStatus s;
  s.record = e.record;
  s.restarts = e.restarts;
  s.dead_by_seq = DeadBySeq(e.record.role, e.record.key(), e.record.incarnation);
  auto since = [&](Time t, milliseconds ttl) {
    return std::max(milliseconds(0), std::chrono::duration_cast<milliseconds>(now - t) + ttl);
  };
  auto alive = alive_.find(path);
  const bool beating = alive != alive_.end() && alive->second == e.record.incarnation;
  auto lost = alive_lost_.find(path);
  const milliseconds silent =
      lost != alive_lost_.end() ? since(lost->second, e.unresponsive_ttl) : e.unresponsive_ttl;
  if (!e.present) {
    s.state = Liveness::kDead;
    s.age = std::max(since(e.deleted_at, e.dead_ttl), silent);
  } else if (s.dead_by_seq != 0) {
    s.state = Liveness::kDead;
    s.age = beating ? milliseconds(0) : silent;
  } else if (beating) {
    s.state = Liveness::kAlive;
  } else {
    s.state = Liveness::kUnresponsive;
    s.age = silent;
  }
  return s;
}

std::vector<RankStatus> EtcdView::ListRanks(Time now) const {
  std::vector<RankStatus> out;
  for (const auto& [k, e] : prefill_)
    out.push_back(StatusOf(EtcdRankPath(RankRole::kPrefill, k, 0), e, now));
  for (const auto& [k, e] : decode_)
    out.push_back(StatusOf(EtcdRankPath(RankRole::kDecode, k.first, k.second), e, now));
  return out;
}

Result<RankRecord> EtcdView::GetRank(int dp, int cp, int tp, int pp) const {
  const RankKey key{dp, cp, tp, pp};
  if (dp < 0 || cp < 0 || tp < 0 || pp < 0) {
    return InvalidArgumentError("prefill rank " + key.ToString() + " has a negative rank");
  }
  if (auto bad = prefill_problems_.find(key); bad != prefill_problems_.end()) {
    return InternalError("etcd registry: the record of prefill " + key.ToString() +
                         " is unusable: " + bad->second);
  }
  KVB_ASSIGN_OR_RETURN(ParallelInfo info, GetParallelInfo());
  if (dp >= info.attn_dp_size || cp >= info.attn_cp_size || tp >= info.attn_tp_size ||
      pp >= info.pp_size) {
    return NotFoundError(
        "prefill rank " + key.ToString() + " is outside the prefill layout (attn_dp_size " +
        std::to_string(info.attn_dp_size) + ", attn_cp_size " + std::to_string(info.attn_cp_size) +
        ", attn_tp_size " + std::to_string(info.attn_tp_size) + ", pp_size " +
        std::to_string(info.pp_size) + ")");
  }
  return prefill_.at(key).record;
}

Result<ParallelInfo> EtcdView::GetParallelInfo() const {
  if (prefill_.empty()) return UnavailableError("no prefill rank registered in etcd yet");
  const RankRecord* ref = &prefill_.begin()->second.record;
  for (const auto& [k, e] : prefill_)
    if (e.present) {
      ref = &e.record;
      break;
    }
  ParallelInfo info = ParallelInfo::Of(*ref);
  for (const auto& [k, e] : prefill_) {
    if (!CompareInstanceLayout(*ref, e.record).ok()) continue;
    ++info.ranks_registered;
    if (info.prefill_http_port == 0) info.prefill_http_port = e.record.prefill_http_port;
  }
  info.ranks_expected = ref->attn_tp_size * ref->attn_cp_size * ref->attn_dp_size * ref->pp_size;
  if (!info.complete()) {
    return UnavailableError(std::to_string(info.ranks_registered) + " of " +
                            std::to_string(info.ranks_expected) +
                            " prefill ranks registered in etcd");
  }
  return info;
}

FailureBatch EtcdView::FailuresSince(uint64_t since) const {
  FailureBatch batch;
  batch.latest_seq = latest_seq_;
  const uint64_t oldest = failures_.empty() ? latest_seq_ + 1 : failures_.begin()->first;
  batch.truncated = since + 1 < oldest && since < latest_seq_;
  for (auto it = failures_.upper_bound(since); it != failures_.end(); ++it)
    batch.records.push_back(it->second.record);
  return batch;
}

Status EtcdView::CheckLayout(const RankRecord& record, Time now) {
  if (record.role != RankRole::kPrefill) return Status::Ok();
  for (const auto& [key, e] : prefill_) {
    const bool replaced = key == record.key() && e.record.incarnation != record.incarnation;
    if (!replaced && e.present && DeadBySeq(RankRole::kPrefill, key, e.record.incarnation) == 0)
      return CompareInstanceLayout(e.record, record);
  }
  if (!prefill_.empty() && !CompareInstanceLayout(prefill_.begin()->second.record, record).ok()) {
    KVB_LOG_WARN(
        "etcd registry: every prefill rank is dead and {} brings a new layout; "
        "forgetting the {} old prefill ranks",
        record.Describe(), prefill_.size());
    prefill_.clear();
  }
  return Status::Ok();
}

}  // namespace kvbridge::internal
