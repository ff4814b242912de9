// JSON forms of the registry's value types (registry.h).
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <limits>

#include "common/base64.h"
#include "common/host_identity.h"
#include "control/json_fields.h"
#include "control/registry.h"

namespace kvbridge::internal {
namespace {

using nlohmann::json;

constexpr int kMaxInt = std::numeric_limits<int>::max();

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

Status SizeAndRank(const char* size_name, int size, const char* rank_name, int rank) {
  if (size < 1) {
    return InvalidArgumentError(std::string("rank record: ") + size_name + " = " +
                                std::to_string(size) + " must be >= 1");
  }
  if (rank < 0 || rank >= size) {
    return InvalidArgumentError(std::string("rank record: ") + rank_name + " = " +
                                std::to_string(rank) + " out of range [0, " + std::to_string(size) +
                                ")");
  }
  return Status::Ok();
}

Status NonEmpty(const char* name, const std::string& value) {
  if (!value.empty()) return Status::Ok();
  return InvalidArgumentError(std::string("rank record: ") + name + " must not be empty");
}

}  // namespace

Status ValidateInstanceId(const char* field, const std::string& id) {
  bool ok = id.size() <= 64;
  for (char c : id)
    ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' ||
                c == '-');
  if (ok) return Status::Ok();
  return InvalidArgumentError(std::string(field) + " '" + id +
                              "' must be at most 64 of [A-Za-z0-9._:-]");
}

std::string_view RankRoleName(RankRole role) {
  return role == RankRole::kPrefill ? "prefill" : "decode";
}

Result<RankRole> ParseRankRole(std::string_view name) {
  std::string lower = Lower(name);
  if (lower == "prefill") return RankRole::kPrefill;
  if (lower == "decode") return RankRole::kDecode;
  return InvalidArgumentError("role '" + std::string(name) + "' is neither prefill nor decode");
}

std::string RankKey::ToString() const {
  return "dp" + std::to_string(dp) + " cp" + std::to_string(cp) + " tp" + std::to_string(tp) +
         " pp" + std::to_string(pp);
}

std::string RankRecord::Describe() const {
  return std::string(RankRoleName(role)) + (instance.empty() ? "" : "[" + instance + "]") + " " +
         key().ToString() + " (host " + host + ", pid " + std::to_string(pid) + ", incarnation " +
         std::to_string(incarnation) + ")";
}

Status RankRecord::Validate() const {
  KVB_RETURN_IF_ERROR(ValidateInstanceId("instance", instance));
  KVB_RETURN_IF_ERROR(SizeAndRank("attn_tp_size", attn_tp_size, "attn_tp_rank", attn_tp_rank));
  KVB_RETURN_IF_ERROR(SizeAndRank("attn_cp_size", attn_cp_size, "attn_cp_rank", attn_cp_rank));
  KVB_RETURN_IF_ERROR(SizeAndRank("attn_dp_size", attn_dp_size, "attn_dp_rank", attn_dp_rank));
  KVB_RETURN_IF_ERROR(SizeAndRank("pp_size", pp_size, "pp_rank", pp_rank));
  int64_t ranks = int64_t{attn_tp_size} * attn_cp_size;
  ranks = std::min<int64_t>(ranks, kMaxRanksPerInstance + 1) * attn_dp_size;
  ranks = std::min<int64_t>(ranks, kMaxRanksPerInstance + 1) * pp_size;
  if (ranks > kMaxRanksPerInstance) {
    return InvalidArgumentError(
        "rank record: attn_tp_size * attn_cp_size * attn_dp_size * pp_size"
        " exceeds " +
        std::to_string(kMaxRanksPerInstance) + " ranks");
  }
  KVB_RETURN_IF_ERROR(CheckHostAddress("rank record: rank_ip", rank_ip));
  if (rank_port < 0 || rank_port > 65535) {
    return InvalidArgumentError("rank record: rank_port = " + std::to_string(rank_port) +
                                " out of range [0, 65535]");
  }
  if (page_size < 1) {
    return InvalidArgumentError("rank record: page_size = " + std::to_string(page_size) +
                                " must be >= 1");
  }
  KVB_RETURN_IF_ERROR(NonEmpty("kv_cache_dtype", kv_cache_dtype));
  KVB_RETURN_IF_ERROR(NonEmpty("host", host));
  if (boot_id.size() > kMaxBootIdBytes) {
    return InvalidArgumentError("rank record: boot_id of " + std::to_string(boot_id.size()) +
                                " bytes, more than " + std::to_string(kMaxBootIdBytes));
  }
  if (pid < 0) {
    return InvalidArgumentError("rank record: pid = " + std::to_string(pid) + " must be >= 0");
  }
  if (prefill_http_port < 0 || prefill_http_port > 65535) {
    return InvalidArgumentError("rank record: prefill_http_port = " +
                                std::to_string(prefill_http_port) + " out of range [0, 65535]");
  }
  if (incarnation == 0) return InvalidArgumentError("rank record: incarnation must be non-zero");
  if (!layout.is_object()) {
    return InvalidArgumentError(std::string("rank record: layout must be an object, got ") +
                                layout.type_name());
  }
  return Status::Ok();
}

json RankRecord::ToJson() const {
  return json{
      {"role", RankRoleName(role)},
      {"attn_tp_size", attn_tp_size},
      {"attn_tp_rank", attn_tp_rank},
      {"attn_cp_size", attn_cp_size},
      {"attn_cp_rank", attn_cp_rank},
      {"attn_dp_size", attn_dp_size},
      {"attn_dp_rank", attn_dp_rank},
      {"pp_size", pp_size},
      {"pp_rank", pp_rank},
      // sglang's server reads these two; kvbridge's dp group is attn_dp.
      {"system_dp_size", 1},
      {"system_dp_rank", 0},
      {"rank_ip", rank_ip},
      {"rank_port", rank_port},
      {"page_size", page_size},
      {"kv_cache_dtype", kv_cache_dtype},
      {"host", host},
      {"boot_id", boot_id},
      {"pid", pid},
      {"incarnation", incarnation},
      {"instance", instance},
      {"transport_address", Base64Encode(transport_address)},
      {"address_tag", Base64Encode(address_tag)},
      {"layout", layout},
      {"dsv41_spec_layout", dsv41_spec_layout},
      {"prefill_http_port", prefill_http_port != 0 ? json(prefill_http_port) : json(nullptr)},
      {"load_balance_method", follow_bootstrap_room ? "follow_bootstrap_room" : "round_robin"},
      {"enable_dsa_cache_layer_split", enable_dsa_cache_layer_split}};
}

namespace {

// An incarnation for a rank that does not send one (an sglang rank): stable
// for one process (its address and position), new when a restart binds a
// new port. FNV-1a, never 0.
uint64_t DerivedIncarnation(const RankRecord& r) {
  const std::string identity = r.rank_ip + ":" + std::to_string(r.rank_port) + "/" +
                               r.key().ToString() + "/" + std::string(RankRoleName(r.role));
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : identity) h = (h ^ c) * 1099511628211ull;
  return h != 0 ? h : 1;
}

// sglang's optional registration fields.
Status SglangExtras(const JsonFields& f, RankRecord* r) {
  if (f.HasValue("system_dp_size")) {
    int size = 1, rank = 0;
    KVB_RETURN_IF_ERROR(f.Int("system_dp_size", 1, kMaxInt, &size));
    KVB_RETURN_IF_ERROR(f.Int("system_dp_rank", 0, kMaxInt, &rank));
    // Without dp-attention sglang's dp group is the system dp rank.
    if (size > 1) {
      r->attn_dp_size = size;
      r->attn_dp_rank = rank;
    }
  }
  if (f.HasValue("prefill_http_port")) {
    KVB_RETURN_IF_ERROR(f.Int("prefill_http_port", 0, 65535, &r->prefill_http_port));
  }
  if (f.HasValue("load_balance_method")) {
    std::string method;
    KVB_RETURN_IF_ERROR(f.String("load_balance_method", &method));
    r->follow_bootstrap_room = method == "follow_bootstrap_room";
  }
  if (f.HasValue("enable_dsa_cache_layer_split")) {
    KVB_RETURN_IF_ERROR(f.Bool("enable_dsa_cache_layer_split", &r->enable_dsa_cache_layer_split));
  }
  if (f.HasValue("dsv41_spec_layout")) {
    KVB_RETURN_IF_ERROR(f.Object("dsv41_spec_layout", &r->dsv41_spec_layout));
    // Bounded: every record must fit one registry value (etcd's).
    if (DumpJson(r->dsv41_spec_layout).size() > RankRecord::kMaxSpecLayoutBytes)
      return f.Error("dsv41_spec_layout is larger than " +
                     std::to_string(RankRecord::kMaxSpecLayoutBytes) + " bytes");
  }
  return Status::Ok();
}

// An optional binary field, base64 in JSON, of at most `max_bytes` decoded
// (`out` untouched when the field is absent).
Status Base64Field(const JsonFields& f, const char* name, size_t max_bytes, std::string* out) {
  if (!f.HasValue(name)) return Status::Ok();
  std::string encoded;
  KVB_RETURN_IF_ERROR(f.String(name, &encoded));
  Result<std::string> decoded = Base64Decode(encoded);
  const std::string field = std::string("rank record: field '") + name + "'";
  if (!decoded.ok()) return decoded.status().WithContext(field);
  if (decoded->size() > max_bytes) {
    return InvalidArgumentError(field + " is " + std::to_string(decoded->size()) +
                                " bytes, more than " + std::to_string(max_bytes));
  }
  *out = std::move(decoded).value();
  return Status::Ok();
}

// kvbridge's optional fields; defaults for a rank that does not send them.
Status KvbridgeExtras(const JsonFields& f, RankRecord* r) {
  if (f.HasValue("host")) {
    KVB_RETURN_IF_ERROR(f.String("host", &r->host));
  } else {
    r->host = r->rank_ip;
  }
  if (f.HasValue("boot_id")) KVB_RETURN_IF_ERROR(f.String("boot_id", &r->boot_id));
  if (f.HasValue("pid")) {
    KVB_RETURN_IF_ERROR(f.Int("pid", int64_t{0}, std::numeric_limits<int64_t>::max(), &r->pid));
  }
  if (f.HasValue("incarnation")) {
    KVB_RETURN_IF_ERROR(f.Uint64("incarnation", &r->incarnation));
  } else {
    r->incarnation = DerivedIncarnation(*r);
  }
  if (f.HasValue("instance")) KVB_RETURN_IF_ERROR(f.String("instance", &r->instance));
  KVB_RETURN_IF_ERROR(Base64Field(f, "transport_address", SIZE_MAX, &r->transport_address));
  KVB_RETURN_IF_ERROR(
      Base64Field(f, "address_tag", RankRecord::kMaxAddressTagBytes, &r->address_tag));
  if (f.HasValue("layout")) KVB_RETURN_IF_ERROR(f.Object("layout", &r->layout));
  return Status::Ok();
}

}  // namespace

Result<RankRecord> RankRecord::FromJson(const json& j) {
  JsonFields f(j, "rank record");
  KVB_RETURN_IF_ERROR(f.RequireObject());
  RankRecord r;
  if (f.HasValue("role")) {
    std::string role;
    KVB_RETURN_IF_ERROR(f.String("role", &role));
    Result<RankRole> parsed_role = ParseRankRole(role);
    if (!parsed_role.ok()) return parsed_role.status().WithContext("rank record: field 'role'");
    r.role = *parsed_role;
  }
  KVB_RETURN_IF_ERROR(f.Int("attn_tp_size", 1, kMaxInt, &r.attn_tp_size));
  KVB_RETURN_IF_ERROR(f.Int("attn_tp_rank", 0, kMaxInt, &r.attn_tp_rank));
  KVB_RETURN_IF_ERROR(f.Int("attn_cp_size", 1, kMaxInt, &r.attn_cp_size));
  KVB_RETURN_IF_ERROR(f.Int("attn_cp_rank", 0, kMaxInt, &r.attn_cp_rank));
  KVB_RETURN_IF_ERROR(f.Int("attn_dp_size", 1, kMaxInt, &r.attn_dp_size));
  KVB_RETURN_IF_ERROR(f.Int("attn_dp_rank", 0, kMaxInt, &r.attn_dp_rank));
  KVB_RETURN_IF_ERROR(f.Int("pp_size", 1, kMaxInt, &r.pp_size));
  KVB_RETURN_IF_ERROR(f.Int("pp_rank", 0, kMaxInt, &r.pp_rank));
  KVB_RETURN_IF_ERROR(f.String("rank_ip", &r.rank_ip));
  KVB_RETURN_IF_ERROR(f.Int("rank_port", 0, 65535, &r.rank_port));
  KVB_RETURN_IF_ERROR(f.Int("page_size", 1, kMaxInt, &r.page_size));
  KVB_RETURN_IF_ERROR(f.String("kv_cache_dtype", &r.kv_cache_dtype));
  KVB_RETURN_IF_ERROR(SglangExtras(f, &r));
  KVB_RETURN_IF_ERROR(KvbridgeExtras(f, &r));
  KVB_RETURN_IF_ERROR(r.Validate());
  return r;
}

ParallelInfo ParallelInfo::Of(const RankRecord& ref) {
  ParallelInfo info;
  info.attn_tp_size = ref.attn_tp_size;
  info.attn_cp_size = ref.attn_cp_size;
  info.attn_dp_size = ref.attn_dp_size;
  info.pp_size = ref.pp_size;
  info.page_size = ref.page_size;
  info.kv_cache_dtype = ref.kv_cache_dtype;
  info.follow_bootstrap_room = ref.follow_bootstrap_room;
  info.enable_dsa_cache_layer_split = ref.enable_dsa_cache_layer_split;
  info.dsv41_spec_layout = ref.dsv41_spec_layout;
  return info;
}

json ParallelInfo::ToJson() const {
  json j{{"attn_tp_size", attn_tp_size},
         {"attn_cp_size", attn_cp_size},
         {"dp_size", attn_dp_size},
         {"pp_size", pp_size},
         {"page_size", page_size},
         {"kv_cache_dtype", kv_cache_dtype},
         {"follow_bootstrap_room", follow_bootstrap_room},
         {"enable_dsa_cache_layer_split", enable_dsa_cache_layer_split},
         {"prefill_http_port", prefill_http_port != 0 ? json(prefill_http_port) : json()},
         {"target_tp_rank", nullptr},
         {"target_tp_ranks", nullptr},
         {"target_cp_ranks", nullptr},
         {"target_pp_ranks", nullptr},
         {"required_dst_info_num", nullptr},
         {"required_prefill_response_num", nullptr}};
  if (!dsv41_spec_layout.is_null()) j["dsv41_spec_layout"] = dsv41_spec_layout;
  return j;
}

Result<ParallelInfo> ParallelInfo::FromJson(const json& j) {
  JsonFields f(j, "parallel info");
  ParallelInfo p;
  KVB_RETURN_IF_ERROR(f.Int("attn_tp_size", 1, kMaxInt, &p.attn_tp_size));
  KVB_RETURN_IF_ERROR(f.Int("attn_cp_size", 1, kMaxInt, &p.attn_cp_size));
  KVB_RETURN_IF_ERROR(f.Int("dp_size", 1, kMaxInt, &p.attn_dp_size));
  KVB_RETURN_IF_ERROR(f.Int("pp_size", 1, kMaxInt, &p.pp_size));
  KVB_RETURN_IF_ERROR(f.Int("page_size", 1, kMaxInt, &p.page_size));
  KVB_RETURN_IF_ERROR(f.String("kv_cache_dtype", &p.kv_cache_dtype));
  if (f.HasValue("follow_bootstrap_room")) {
    KVB_RETURN_IF_ERROR(f.Bool("follow_bootstrap_room", &p.follow_bootstrap_room));
  }
  if (f.HasValue("enable_dsa_cache_layer_split")) {
    KVB_RETURN_IF_ERROR(f.Bool("enable_dsa_cache_layer_split", &p.enable_dsa_cache_layer_split));
  }
  if (f.HasValue("prefill_http_port")) {
    KVB_RETURN_IF_ERROR(f.Int("prefill_http_port", 0, 65535, &p.prefill_http_port));
  }
  // Not used here: a value that is not an object is left out, not an error.
  if (f.HasValue("dsv41_spec_layout") && j.at("dsv41_spec_layout").is_object())
    p.dsv41_spec_layout = j.at("dsv41_spec_layout");
  // Each factor is checked before the next multiplies it: four sizes near
  // INT_MAX would overflow the product and wrap below the limit.
  int64_t ranks = 1;
  for (int size : {p.attn_tp_size, p.attn_cp_size, p.attn_dp_size, p.pp_size}) {
    ranks *= size;  // <= 65536 * INT_MAX: fits
    if (ranks > kMaxRanksPerInstance) break;
  }
  if (ranks > kMaxRanksPerInstance) {
    return f.Error("attn_tp_size * attn_cp_size * dp_size * pp_size exceeds " +
                   std::to_string(kMaxRanksPerInstance) + " ranks");
  }
  // Served only once every rank registered.
  p.ranks_registered = p.ranks_expected = static_cast<int>(ranks);
  return p;
}

std::string_view LivenessName(Liveness state) {
  switch (state) {
    case Liveness::kAlive:
      return "alive";
    case Liveness::kUnresponsive:
      return "unresponsive";
    case Liveness::kDead:
      return "dead";
  }
  return "unknown";
}

Result<Liveness> ParseLiveness(std::string_view name) {
  for (Liveness s : {Liveness::kAlive, Liveness::kUnresponsive, Liveness::kDead}) {
    if (name == LivenessName(s)) return s;
  }
  return InvalidArgumentError("liveness state '" + std::string(name) + "' is unknown");
}

json RankStatus::ToJson() const {
  return json{{"record", record.ToJson()},
              {"age_ms", age.count()},
              {"state", LivenessName(state)},
              {"restarts", restarts},
              {"dead_by_seq", dead_by_seq}};
}

Result<RankStatus> RankStatus::FromJson(const json& j) {
  JsonFields f(j, "rank status");
  RankStatus s;
  json record;
  KVB_RETURN_IF_ERROR(f.Object("record", &record));
  KVB_ASSIGN_OR_RETURN(s.record, RankRecord::FromJson(record));
  int64_t age_ms = 0;
  KVB_RETURN_IF_ERROR(f.Int("age_ms", int64_t{0}, std::numeric_limits<int64_t>::max(), &age_ms));
  s.age = std::chrono::milliseconds(age_ms);
  std::string state;
  KVB_RETURN_IF_ERROR(f.String("state", &state));
  Result<Liveness> parsed = ParseLiveness(state);
  if (!parsed.ok()) return parsed.status().WithContext("rank status: field 'state'");
  s.state = *parsed;
  KVB_RETURN_IF_ERROR(f.Uint64("restarts", &s.restarts));
  KVB_RETURN_IF_ERROR(f.Uint64("dead_by_seq", &s.dead_by_seq));
  return s;
}

json FailureBatch::ToJson() const {
  return json{{"records", records}, {"latest_seq", latest_seq}, {"truncated", truncated}};
}

Result<FailureBatch> FailureBatch::FromJson(const json& j) {
  JsonFields f(j, "failure batch");
  FailureBatch b;
  const json* records = nullptr;
  KVB_RETURN_IF_ERROR(f.Array("records", &records));
  for (const json& r : *records) {
    if (!r.is_object()) return f.Error("every entry of 'records' must be an object");
    b.records.push_back(r);
  }
  KVB_RETURN_IF_ERROR(f.Uint64("latest_seq", &b.latest_seq));
  KVB_RETURN_IF_ERROR(f.Bool("truncated", &b.truncated));
  return b;
}

Status ValidateRegistryOptions(const RegistryOptions& o) {
  if (o.unresponsive_after.count() <= 0) {
    return InvalidArgumentError("registry options: unresponsive_after must be > 0");
  }
  if (o.dead_after < o.unresponsive_after) {
    return InvalidArgumentError("registry options: dead_after (" +
                                std::to_string(o.dead_after.count()) +
                                " ms) must be >= unresponsive_after (" +
                                std::to_string(o.unresponsive_after.count()) + " ms)");
  }
  if (o.forget_decode_after < o.dead_after) {
    return InvalidArgumentError("registry options: forget_decode_after must be >= dead_after");
  }
  if (o.max_failure_records == 0) {
    return InvalidArgumentError("registry options: max_failure_records must be >= 1");
  }
  if (o.max_decode_ranks == 0) {
    return InvalidArgumentError("registry options: max_decode_ranks must be >= 1");
  }
  return Status::Ok();
}

}  // namespace kvbridge::internal
