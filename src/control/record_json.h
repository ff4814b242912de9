// FailureRecord <-> JSON: what the registry stores and `kvbridge status`,
// the demo and the Python layer print. "origin" carries the fields the
// registry uses to mark a rank dead (role, dp, tp, pp, cp, incarnation).
//
// The reader is the one schema of a failure record: the registry checks a
// posted record with it before keeping it, and every rank reads records
// from the registry with it, so a mistyped or oversized field is an error
// naming that field, never an exception.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

#include "kvbridge/errors.h"
#include "kvbridge/status.h"

namespace kvbridge::internal {

// Longest text field (detail, hint, mechanism, host, instance) a record may
// carry; what a rank writes is far shorter.
inline constexpr size_t kMaxRecordTextBytes = 4096;
// `text` cut, before a character it would split, to kMaxRecordTextBytes: a
// longer text (an application's reason) would make the registry and every
// peer refuse the whole record.
std::string ClipRecordText(std::string text);

nlohmann::json RankIdToJson(const RankId& rank);
nlohmann::json FailureRecordToJson(const FailureRecord& record);
// Requires "origin" (role, dp, tp, pp) and a known "cause"; every other
// field is optional but must have its type and range when present.
// InvalidArgument naming the missing, mistyped or out-of-range field.
Result<FailureRecord> FailureRecordFromJson(const nlohmann::json& j);

}  // namespace kvbridge::internal
