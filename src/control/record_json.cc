#include "control/record_json.h"

#include <chrono>
#include <limits>

#include "common/text.h"
#include "control/json_fields.h"

namespace kvbridge::internal {

std::string ClipRecordText(std::string text) {
  if (text.size() > kMaxRecordTextBytes) text = std::string(Utf8Prefix(text, kMaxRecordTextBytes));
  return text;
}

namespace {

using nlohmann::json;

// Timestamps are microseconds since the epoch; the bound keeps the
// conversion to the clock's nanoseconds from overflowing (year ~2255).
constexpr int64_t kMaxMicros = int64_t{9'000'000'000'000'000};

int64_t Micros(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

Status Text(const JsonFields& f, const char* name, std::string* out) {
  if (!f.Has(name)) return Status::Ok();
  KVB_RETURN_IF_ERROR(f.String(name, out));
  if (out->size() > kMaxRecordTextBytes) {
    return f.Error(std::string("field '") + name + "' is " + std::to_string(out->size()) +
                   " bytes, more than the limit of " + std::to_string(kMaxRecordTextBytes));
  }
  return Status::Ok();
}

Status Time(const JsonFields& f, const char* name, std::chrono::system_clock::time_point* out) {
  if (!f.Has(name)) return Status::Ok();
  int64_t us = 0;
  KVB_RETURN_IF_ERROR(f.Int(name, int64_t{0}, kMaxMicros, &us));
  *out = std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::microseconds(us)));
  return Status::Ok();
}

Result<RankId> RankIdFromJson(const JsonFields& parent, const char* name, const char* what) {
  json j;
  KVB_RETURN_IF_ERROR(parent.Object(name, &j));
  JsonFields f(j, what);
  RankId r;
  std::string role;
  KVB_RETURN_IF_ERROR(f.String("role", &role));
  if (role == "prefill") {
    r.role = Role::kPrefill;
  } else if (role == "decode") {
    r.role = Role::kDecode;
  } else if (role == "bootstrap") {
    r.role = Role::kBootstrap;
  } else {
    return f.Error("field 'role' = '" + Clip(role, 64) + "' is not prefill, decode or bootstrap");
  }
  constexpr int kMaxRank = 1 << 20;
  KVB_RETURN_IF_ERROR(f.Int("dp", 0, kMaxRank, &r.dp));
  KVB_RETURN_IF_ERROR(f.Int("tp", 0, kMaxRank, &r.tp));
  KVB_RETURN_IF_ERROR(f.Int("pp", 0, kMaxRank, &r.pp));
  if (f.Has("cp")) KVB_RETURN_IF_ERROR(f.Int("cp", 0, kMaxRank, &r.cp));
  KVB_RETURN_IF_ERROR(Text(f, "host", &r.host));
  if (f.Has("boot_id")) KVB_RETURN_IF_ERROR(Text(f, "boot_id", &r.boot_id));
  if (f.Has("pid")) KVB_RETURN_IF_ERROR(f.Int("pid", 0, std::numeric_limits<int>::max(), &r.pid));
  if (f.Has("incarnation")) KVB_RETURN_IF_ERROR(f.Uint64("incarnation", &r.incarnation));
  KVB_RETURN_IF_ERROR(Text(f, "instance", &r.instance));
  return r;
}

Result<Phase> PhaseFromJson(const JsonFields& f) {
  if (!f.Has("phase")) return Phase::kTransferring;
  std::string name;
  KVB_RETURN_IF_ERROR(f.String("phase", &name));
  for (Phase p : {Phase::kBootstrapping, Phase::kWaitingForMetadata, Phase::kWaitingForInput,
                  Phase::kTransferring, Phase::kDone}) {
    if (PhaseName(p) == name) return p;
  }
  return f.Error("field 'phase' = '" + Clip(name, 64) + "' is not a known phase");
}

}  // namespace

json RankIdToJson(const RankId& r) {
  return {{"role", RoleName(r.role)},
          {"dp", r.dp},
          {"tp", r.tp},
          {"pp", r.pp},
          {"cp", r.cp},
          {"host", r.host},
          {"boot_id", r.boot_id},
          {"pid", r.pid},
          {"incarnation", r.incarnation},
          {"instance", r.instance},
          {"name", r.ShortName()}};
}

json FailureRecordToJson(const FailureRecord& f) {
  return {{"room", f.room},
          {"generation", f.generation},
          {"origin", RankIdToJson(f.origin)},
          {"cause", FailureCauseName(f.cause)},
          {"code", StatusCodeName(f.code())},
          {"detail", f.detail},
          {"phase", PhaseName(f.phase)},
          {"detected_by", RankIdToJson(f.detected_by)},
          {"mechanism", f.mechanism},
          {"detected_at_us", Micros(f.detected_at)},
          {"last_sign_of_life_us", Micros(f.last_sign_of_life)},
          {"hint", f.hint},
          {"is_from_another_rank", f.is_from_another_rank},
          {"message", f.Message()}};
}

Result<FailureRecord> FailureRecordFromJson(const json& j) {
  JsonFields f(j, "failure record");
  KVB_RETURN_IF_ERROR(f.RequireObject());
  FailureRecord r;
  KVB_ASSIGN_OR_RETURN(r.origin, RankIdFromJson(f, "origin", "failure record origin"));
  if (f.Has("detected_by")) {
    KVB_ASSIGN_OR_RETURN(r.detected_by,
                         RankIdFromJson(f, "detected_by", "failure record detected_by"));
  }
  std::string cause;
  KVB_RETURN_IF_ERROR(f.String("cause", &cause));
  if (!ParseFailureCause(cause, &r.cause)) {
    return f.Error("field 'cause' = '" + Clip(cause, 64) + "' is not a known cause");
  }
  KVB_ASSIGN_OR_RETURN(r.phase, PhaseFromJson(f));
  if (f.Has("room")) KVB_RETURN_IF_ERROR(f.Uint64("room", &r.room));
  if (f.Has("generation")) KVB_RETURN_IF_ERROR(f.Uint64("generation", &r.generation));
  KVB_RETURN_IF_ERROR(Text(f, "detail", &r.detail));
  KVB_RETURN_IF_ERROR(Text(f, "mechanism", &r.mechanism));
  KVB_RETURN_IF_ERROR(Text(f, "hint", &r.hint));
  r.is_from_another_rank = true;
  if (f.Has("is_from_another_rank")) {
    KVB_RETURN_IF_ERROR(f.Bool("is_from_another_rank", &r.is_from_another_rank));
  }
  KVB_RETURN_IF_ERROR(Time(f, "detected_at_us", &r.detected_at));
  KVB_RETURN_IF_ERROR(Time(f, "last_sign_of_life_us", &r.last_sign_of_life));
  return r;
}

}  // namespace kvbridge::internal
