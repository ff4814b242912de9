// Helpers shared by the copy-run planners (plan_runs.cc, plan_state.cc).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/plan.h"

namespace kvbridge::internal::planning {

// Appends `run`, extending the previous run instead when `run` continues it
// on both sides.
inline void Append(std::vector<CopyRun>& runs, const CopyRun& run) {
  if (!runs.empty()) {
    CopyRun& last = runs.back();
    if (last.cls == run.cls && last.src_buffer == run.src_buffer &&
        last.dst_buffer == run.dst_buffer && last.src_offset + last.length == run.src_offset &&
        last.dst_offset + last.length == run.dst_offset) {
      last.length += run.length;
      return;
    }
  }
  runs.push_back(run);
}

// Items every buffer of `buffers` can hold (0 when there are none).
inline uint64_t ItemCapacity(const std::vector<BufferSpan>& buffers) {
  uint64_t bound = buffers.empty() ? 0 : UINT64_MAX;
  for (const BufferSpan& b : buffers) bound = std::min(bound, b.length / b.item_len);
  return bound;
}

// `position` < 0: a single index, not an element of a list.
inline Status CheckIndex(int64_t index, uint64_t bound, const char* what, int64_t position = -1) {
  if (index >= 0 && static_cast<uint64_t>(index) < bound) return Status::Ok();
  if (position < 0) {
    return InvalidArgumentError(fmt::format("{} {} out of range [0, {})", what, index, bound));
  }
  return InvalidArgumentError(
      fmt::format("{} {} at position {} out of range [0, {})", what, index, position, bound));
}

inline Status CheckSameLength(size_t src, size_t dst, const char* what) {
  if (src == dst) return Status::Ok();
  return InvalidArgumentError(
      fmt::format("{} list length mismatch: source {}, destination {}", what, src, dst));
}

// CheckLayout's part for state_sharding, and CheckCompatible's for state
// buffers (plan_state.cc).
Status CheckStateSharding(const RankLayout& layout);
// state_types and state_layer_ids against the state buffers (plan.h).
Status CheckStateMeta(const RankLayout& layout);
Status CheckStateCompatible(const RankLayout& prefill, const RankLayout& decode);

}  // namespace kvbridge::internal::planning
