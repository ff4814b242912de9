// Copy-run planning: page lists (and aux rows, state slots) to CopyRuns.
//
// The point is the number of runs: every run becomes one transport write, and
// one write per (layer, page, head) is what makes today's connectors slow.
// Runs are emitted in order and each is merged into the previous one whenever
// both sides continue exactly where it ended, so consecutive pages (and, for
// head slices, consecutive tokens) collapse without a separate pass.
#include <fmt/format.h>

#include <algorithm>

#include "engine/plan.h"
#include "engine/plan_util.h"

namespace kvbridge::internal {
namespace {

using planning::Append;
using planning::CheckIndex;
using planning::CheckSameLength;
using planning::ItemCapacity;

Status CheckSlice(const RankLayout& prefill, const RankLayout& decode, const HeadSlice& s) {
  if (s.prefill_rank != prefill.tp_rank || s.decode_rank != decode.tp_rank) {
    return InvalidArgumentError(fmt::format(
        "slice is for prefill rank {} -> decode rank {}, layouts are prefill rank {} -> decode "
        "rank {}",
        s.prefill_rank, s.decode_rank, prefill.tp_rank, decode.tp_rank));
  }
  if (s.num_heads < 1) {
    return InvalidArgumentError(fmt::format("slice num_heads {} < 1", s.num_heads));
  }
  if (s.src_head < 0 || s.src_head + s.num_heads > prefill.kv_heads) {
    return InvalidArgumentError(fmt::format("slice source heads [{}, {}) out of range [0, {})",
                                            s.src_head, s.src_head + s.num_heads,
                                            prefill.kv_heads));
  }
  if (s.dst_head < 0 || s.dst_head + s.num_heads > decode.kv_heads) {
    return InvalidArgumentError(fmt::format("slice destination heads [{}, {}) out of range [0, {})",
                                            s.dst_head, s.dst_head + s.num_heads, decode.kv_heads));
  }
  if (prefill.is_mla) return Status::Ok();  // one replicated "head", checked above
  // A slice that is in range but shifted would silently put head h's cache
  // under head h'; decode would then produce gibberish, not an error.
  const int src_global =
      HeadsOfRank(prefill.total_kv_heads, prefill.tp_size, prefill.tp_rank).first + s.src_head;
  const int dst_global =
      HeadsOfRank(decode.total_kv_heads, decode.tp_size, decode.tp_rank).first + s.dst_head;
  if (src_global != dst_global) {
    return InvalidArgumentError(fmt::format(
        "slice maps model head {} of prefill to model head {} of decode", src_global, dst_global));
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<CopyRun>> PlanKvPages(const RankLayout& prefill, const RankLayout& decode,
                                         const HeadSlice& slice, std::span<const int32_t> src_pages,
                                         std::span<const int32_t> dst_pages) {
  KVB_ASSIGN_OR_RETURN(std::vector<uint32_t> pairs, CompatiblePairs(prefill, decode));
  KVB_RETURN_IF_ERROR(CheckSameLength(src_pages.size(), dst_pages.size(), "page"));
  KVB_RETURN_IF_ERROR(CheckSlice(prefill, decode, slice));
  KVB_RETURN_IF_ERROR(CheckPageIndices(prefill, src_pages, /*unique=*/false).WithContext("source"));
  KVB_RETURN_IF_ERROR(
      CheckPageIndices(decode, dst_pages, /*unique=*/false).WithContext("destination"));

  const uint64_t page_size = static_cast<uint64_t>(prefill.page_size);
  const uint64_t src_heads = static_cast<uint64_t>(prefill.kv_heads);
  const uint64_t dst_heads = static_cast<uint64_t>(decode.kv_heads);
  const uint64_t n = static_cast<uint64_t>(slice.num_heads);
  // Whole pages on both sides: a page is one contiguous block on each side.
  const bool whole = n == src_heads && n == dst_heads;

  std::vector<CopyRun> runs;
  for (size_t i = 0; i < pairs.size(); ++i) {
    const uint32_t sb = static_cast<uint32_t>(i);
    const uint32_t db = pairs[i];
    const uint64_t src_item = prefill.kv[sb].item_len;
    const uint64_t dst_item = decode.kv[db].item_len;
    const uint64_t head_bytes = src_item / (page_size * src_heads);
    for (size_t k = 0; k < src_pages.size(); ++k) {
      const uint64_t src_page = static_cast<uint64_t>(src_pages[k]) * src_item;
      const uint64_t dst_page = static_cast<uint64_t>(dst_pages[k]) * dst_item;
      if (whole) {
        Append(runs, {BufferClass::kKv, sb, src_page, db, dst_page, src_item});
        continue;
      }
      for (uint64_t t = 0; t < page_size; ++t) {
        const uint64_t src_off = src_page + (t * src_heads + slice.src_head) * head_bytes;
        const uint64_t dst_off = dst_page + (t * dst_heads + slice.dst_head) * head_bytes;
        Append(runs, {BufferClass::kKv, sb, src_off, db, dst_off, n * head_bytes});
      }
    }
  }
  return runs;
}

Result<std::vector<CopyRun>> PlanAux(const RankLayout& prefill, const RankLayout& decode,
                                     int64_t src_index, int64_t dst_index) {
  KVB_RETURN_IF_ERROR(CheckCompatible(prefill, decode));
  std::vector<CopyRun> runs;
  // A model without aux buffers has nothing to send; the index is moot.
  if (prefill.aux.empty()) return runs;
  KVB_RETURN_IF_ERROR(CheckIndex(src_index, ItemCapacity(prefill.aux), "source aux index"));
  KVB_RETURN_IF_ERROR(CheckIndex(dst_index, ItemCapacity(decode.aux), "destination aux index"));
  runs.reserve(prefill.aux.size());
  for (size_t b = 0; b < prefill.aux.size(); ++b) {
    const uint64_t item = prefill.aux[b].item_len;
    runs.push_back({BufferClass::kAux, static_cast<uint32_t>(b),
                    static_cast<uint64_t>(src_index) * item, static_cast<uint32_t>(b),
                    static_cast<uint64_t>(dst_index) * item, item});
  }
  return runs;
}

}  // namespace kvbridge::internal
