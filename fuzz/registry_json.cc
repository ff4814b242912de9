// Fuzz target: what the bootstrap server's handlers and the registry client
// do with a body or an answer (control/json_fields.h, record_json.h,
// registry.h): ParseJson, then every reader of a registry JSON form, then the
// in-memory registry's writes with whatever read.
//
// Checks: nothing throws or crashes; a rejection says why; a text ParseJson
// accepts nests at most kMaxJsonDepth deep (dumping it again must work); a
// failure record the reader accepts reads back equal from its canonical
// form; a rank record accepted by FromJson is one Register accepts or
// refuses with a reason.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>

#include "common/log.h"
#include "control/json_fields.h"
#include "control/record_json.h"
#include "control/registry.h"

using namespace kvbridge;            // NOLINT: a fuzz target's own namespace
using namespace kvbridge::internal;  // NOLINT

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

void CheckRefusal(const Status& s) { Check(s.ok() || !s.message().empty()); }

Registry& TheRegistry() {
  static std::unique_ptr<Registry> registry = [] {
    SetLogLevel("off");  // the registry logs every record it keeps
    RegistryOptions o;
    o.max_failure_records = 16;
    o.max_decode_ranks = 16;
    o.max_dp_rank_entries = 16;
    return CreateMemoryRegistry(o);
  }();
  return *registry;
}

// The credentials Register handed out, by the rank they name, so that a
// record naming a registered reporter reaches the registry's rules behind
// the credential check.
std::map<std::string, std::string>& Credentials() {
  static std::map<std::string, std::string> credentials;
  return credentials;
}

std::string ReporterName(int role, const RankKey& key, uint64_t incarnation) {
  return std::to_string(role) + " " + key.ToString() + " " + std::to_string(incarnation);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Result<nlohmann::json> parsed = ParseJson(text, "fuzz input", size_t{1} << 20);
  if (!parsed.ok()) {
    Check(parsed.status().code() == StatusCode::kInvalidArgument);
    Check(!parsed.status().message().empty());
    return 0;
  }
  const nlohmann::json& j = *parsed;
  Check(!DumpJson(j).empty());

  Result<FailureRecord> record = FailureRecordFromJson(j);
  CheckRefusal(record.status());
  if (record.ok()) {
    Result<FailureRecord> back = FailureRecordFromJson(FailureRecordToJson(*record));
    Check(back.ok());
    Check(FailureRecordToJson(*back) == FailureRecordToJson(*record));
    Check(!record->Message().empty());
  }
  std::string credential;
  if (record.ok()) {
    const RankId& by = record->detected_by;
    auto it = Credentials().find(ReporterName(by.role == Role::kPrefill ? 0 : 1,
                                              RankKey{by.dp, by.cp, by.tp, by.pp}, by.incarnation));
    if (it != Credentials().end()) credential = it->second;
  }
  CheckRefusal(TheRegistry().Publish(j, credential).status());

  Result<RankRecord> rank = RankRecord::FromJson(j);
  CheckRefusal(rank.status());
  if (rank.ok()) {
    Check(rank->Validate().ok());
    Result<RankRecord> back = RankRecord::FromJson(rank->ToJson());
    Check(back.ok());
    Check(back->ToJson() == rank->ToJson());
    Result<std::string> given = TheRegistry().Register(*rank, "");
    CheckRefusal(given.status());
    if (given.ok()) {
      Check(given->size() >= 32);  // >= 128 bits
      if (Credentials().size() > 64) Credentials().clear();
      Credentials()[ReporterName(rank->role == RankRole::kPrefill ? 0 : 1, rank->key(),
                                 rank->incarnation)] = *given;
    }
  }
  CheckRefusal(ParallelInfo::FromJson(j).status());
  CheckRefusal(RankStatus::FromJson(j).status());
  CheckRefusal(FailureBatch::FromJson(j).status());
  TheRegistry().ListRanks().status().IgnoreError();
  TheRegistry().GetParallelInfo().status().IgnoreError();
  TheRegistry().FailuresSince(0).status().IgnoreError();
  return 0;
}
