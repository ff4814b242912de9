// RankLayout <-> JSON, as published in the bootstrap registry so decode can
// check compatibility before it connects.
#pragma once

#include <nlohmann/json.hpp>

#include "engine/plan.h"
#include "kvbridge/options.h"
#include "kvbridge/status.h"

namespace kvbridge::internal {

nlohmann::json LayoutToJson(const RankLayout& layout);
// InvalidArgument naming the missing or mistyped field.
Result<RankLayout> LayoutFromJson(const nlohmann::json& j);

// The state part of a rank's layout from its KVArgs, with `layout.state`
// already set: state types and sharding. InvalidArgument naming the field.
Status StateLayoutFromArgs(const KVArgs& args, RankLayout& layout);
// A rank's layout from its options (KVArgs, parallel layout, MLA), checked
// (CheckLayout); InvalidArgument for a prefill rank with dcp_size > 1.
Result<RankLayout> LayoutFromOptions(const ManagerOptions& options);

}  // namespace kvbridge::internal
