#include "connector/record_json.h"

#include <chrono>

namespace kvbridge::internal {
namespace {

int64_t Micros(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

Result<RankId> RankIdFromJson(const nlohmann::json& j, const char* what) {
  if (!j.is_object()) return InvalidArgumentError(std::string(what) + " is not an object");
  RankId r;
  try {
    std::string role = j.at("role").get<std::string>();
    if (role == "prefill") {
      r.role = Role::kPrefill;
    } else if (role == "decode") {
      r.role = Role::kDecode;
    } else if (role == "bootstrap") {
      r.role = Role::kBootstrap;
    } else {
      return InvalidArgumentError(std::string(what) + ".role '" + role + "' unknown");
    }
    r.dp = j.at("dp").get<int>();
    r.tp = j.at("tp").get<int>();
    r.pp = j.at("pp").get<int>();
    r.cp = j.value("cp", 0);
    r.host = j.value("host", std::string());
    r.pid = j.value("pid", 0);
    r.incarnation = j.value("incarnation", uint64_t{0});
    r.instance = j.value("instance", std::string());
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(std::string(what) + ": " + e.what());
  }
  return r;
}

}  // namespace

nlohmann::json RankIdToJson(const RankId& r) {
  return {{"role", RoleName(r.role)},
          {"dp", r.dp},
          {"tp", r.tp},
          {"pp", r.pp},
          {"cp", r.cp},
          {"host", r.host},
          {"pid", r.pid},
          {"incarnation", r.incarnation},
          {"instance", r.instance},
          {"name", r.ShortName()}};
}

nlohmann::json FailureRecordToJson(const FailureRecord& f) {
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

Result<FailureRecord> FailureRecordFromJson(const nlohmann::json& j) {
  if (!j.is_object()) return InvalidArgumentError("failure record is not an object");
  FailureRecord f;
  KVB_ASSIGN_OR_RETURN(f.origin, RankIdFromJson(j.value("origin", nlohmann::json()), "origin"));
  KVB_ASSIGN_OR_RETURN(f.detected_by,
                       RankIdFromJson(j.value("detected_by", nlohmann::json()), "detected_by"));
  std::string cause = j.value("cause", std::string());
  if (!ParseFailureCause(cause, &f.cause))
    return InvalidArgumentError("failure record cause '" + cause + "' unknown");
  std::string phase = j.value("phase", std::string());
  f.phase = Phase::kTransferring;
  for (Phase p : {Phase::kBootstrapping, Phase::kWaitingForMetadata, Phase::kWaitingForInput,
                  Phase::kTransferring, Phase::kDone})
    if (PhaseName(p) == phase) f.phase = p;
  f.room = j.value("room", uint64_t{0});
  f.generation = j.value("generation", uint64_t{0});
  f.detail = j.value("detail", std::string());
  f.mechanism = j.value("mechanism", std::string());
  f.hint = j.value("hint", std::string());
  f.is_from_another_rank = j.value("is_from_another_rank", true);
  f.detected_at = std::chrono::system_clock::time_point(
      std::chrono::microseconds(j.value("detected_at_us", int64_t{0})));
  f.last_sign_of_life = std::chrono::system_clock::time_point(
      std::chrono::microseconds(j.value("last_sign_of_life_us", int64_t{0})));
  return f;
}

}  // namespace kvbridge::internal
