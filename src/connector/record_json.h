// FailureRecord <-> JSON: what the registry stores and `kvbridge status`,
// the demo and the Python layer print. "origin" carries the fields the
// registry uses to mark a rank dead (role, dp, tp, pp, cp, incarnation).
#pragma once

#include <nlohmann/json.hpp>

#include "kvbridge/errors.h"
#include "kvbridge/status.h"

namespace kvbridge::internal {

nlohmann::json RankIdToJson(const RankId& rank);
nlohmann::json FailureRecordToJson(const FailureRecord& record);
// InvalidArgument naming the missing or mistyped field.
Result<FailureRecord> FailureRecordFromJson(const nlohmann::json& j);

}  // namespace kvbridge::internal
