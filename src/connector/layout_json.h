// RankLayout <-> JSON, as published in the bootstrap registry so decode can
// check compatibility before it connects.
#pragma once

#include <nlohmann/json.hpp>

#include "engine/plan.h"
#include "kvbridge/status.h"

namespace kvbridge::internal {

nlohmann::json LayoutToJson(const RankLayout& layout);
// InvalidArgument naming the missing or mistyped field.
Result<RankLayout> LayoutFromJson(const nlohmann::json& j);

}  // namespace kvbridge::internal
