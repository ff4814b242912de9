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

namespace {

// The draft entries under decode dcp: every rank holds every draft token,
// in pages dcp_size times wider than prefill's, so page q of the request
// (after the prefix) is one run into the (q % dcp)-th part of decode's page
// dst_pages[q / dcp].
Status AppendDcpDraftPages(const RankLayout& prefill, const RankLayout& decode,
                           const std::vector<uint32_t>& pairs, std::span<const int32_t> src_pages,
                           std::span<const int32_t> dst_pages, uint64_t first_page,
                           std::vector<CopyRun>& runs) {
  const uint64_t dcp = static_cast<uint64_t>(decode.dcp_size);
  for (size_t i = 0; i < pairs.size(); ++i) {
    if (!IsDraftKv(prefill, i)) continue;
    const uint64_t src_item = prefill.kv[i].item_len;
    const uint64_t dst_item = decode.kv[pairs[i]].item_len;  // dcp x src_item (CheckCompatible)
    for (size_t j = 0; j < src_pages.size(); ++j) {
      const uint64_t q = first_page + j;
      if (q / dcp >= dst_pages.size())
        return InvalidArgumentError(
            fmt::format("decode dcp rank {} of {} gave {} pages; draft page {} of the request "
                        "needs {}",
                        decode.dcp_rank, dcp, dst_pages.size(), q, q / dcp + 1));
      Append(runs, {BufferClass::kKv, static_cast<uint32_t>(i),
                    static_cast<uint64_t>(src_pages[j]) * src_item, pairs[i],
                    static_cast<uint64_t>(dst_pages[q / dcp]) * dst_item + (q % dcp) * src_item,
                    src_item});
    }
  }
  return Status();
}

}  // namespace

Result<std::vector<CopyRun>> PlanKvDcpTokens(const RankLayout& prefill, const RankLayout& decode,
                                             std::span<const int32_t> src_pages,
                                             std::span<const int32_t> dst_pages,
                                             int64_t first_page) {
  KVB_ASSIGN_OR_RETURN(std::vector<uint32_t> pairs, CompatiblePairs(prefill, decode));
  if (decode.dcp_size < 2)
    return InvalidArgumentError(
        fmt::format("decode dcp_size {}: no context parallelism to plan for", decode.dcp_size));
  if (first_page < 0 || first_page > INT32_MAX)
    return InvalidArgumentError(fmt::format("first page {} out of range", first_page));
  KVB_RETURN_IF_ERROR(CheckPageIndices(prefill, src_pages, /*unique=*/false).WithContext("source"));
  KVB_RETURN_IF_ERROR(
      CheckPageIndices(decode, dst_pages, /*unique=*/false).WithContext("destination"));
  const uint64_t page = static_cast<uint64_t>(prefill.page_size);
  const uint64_t dcp = static_cast<uint64_t>(decode.dcp_size);
  const uint64_t begin = static_cast<uint64_t>(first_page) * page;
  const uint64_t end = begin + src_pages.size() * page;
  // The first position of the chunk this rank owns, then every dcp-th.
  const uint64_t first = begin + (decode.dcp_rank + dcp - begin % dcp) % dcp;
  std::vector<CopyRun> runs;
  if (first < end) {
    const uint64_t last = first + (end - 1 - first) / dcp * dcp;
    if (last / dcp / page >= dst_pages.size())
      return InvalidArgumentError(
          fmt::format("decode dcp rank {} of {} gave {} pages; token {} of the request needs {}",
                      decode.dcp_rank, dcp, dst_pages.size(), last, last / dcp / page + 1));
  }
  for (size_t i = 0; i < pairs.size() && first < end; ++i) {
    if (IsDraftKv(prefill, i)) continue;
    const uint32_t sb = static_cast<uint32_t>(i);
    const uint32_t db = pairs[i];
    const uint64_t src_item = prefill.kv[sb].item_len;
    const uint64_t dst_item = decode.kv[db].item_len;
    const uint64_t token = src_item / page;  // CheckCompatible: the same on both sides
    for (uint64_t p = first; p < end; p += dcp) {
      const uint64_t src_off =
          static_cast<uint64_t>(src_pages[(p - begin) / page]) * src_item + (p % page) * token;
      const uint64_t row = p / dcp;
      const uint64_t dst_off =
          static_cast<uint64_t>(dst_pages[row / page]) * dst_item + (row % page) * token;
      Append(runs, {BufferClass::kKv, sb, src_off, db, dst_off, token});
    }
  }
  KVB_RETURN_IF_ERROR(AppendDcpDraftPages(prefill, decode, pairs, src_pages, dst_pages,
                                          static_cast<uint64_t>(first_page), runs));
  return runs;
}

int SendingCpRanks(int prefill_cp_size, bool all_cp_ranks) {
  return all_cp_ranks ? std::max(prefill_cp_size, 1) : 1;
}

PageShare CpPageShare(int64_t pages, int cp_size, int cp_rank) {
  if (pages <= 0 || cp_size < 1 || cp_rank < 0 || cp_rank >= cp_size) return {};
  const int64_t base = pages / cp_size, rem = pages % cp_size;
  return {cp_rank * base + std::min<int64_t>(cp_rank, rem), base + (cp_rank < rem ? 1 : 0)};
}

int64_t DestinationPageCount(const RankLayout& decode, int64_t src_pages) {
  if (decode.dcp_size <= 1 || src_pages <= 0) return src_pages;
  return src_pages / decode.dcp_size + (src_pages % decode.dcp_size != 0);
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
