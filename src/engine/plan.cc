// Layout checks, head ownership and TP flows. Copy-run planning is in
// plan_runs.cc.
//
// These functions are pure and do not log: the caller (the connector) knows
// the room and the peer, logs the error once with that context, and passes
// the Status up.
#include "engine/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <unordered_map>
#include <utility>

#include "engine/plan_util.h"

namespace kvbridge::internal {
namespace {

int NumLayers(const RankLayout& l) { return l.end_layer - l.start_layer; }

// The target model's kv buffers: all but the draft entries at the tail.
size_t TargetKvCount(const RankLayout& l) {
  const size_t draft = static_cast<size_t>(std::max(l.num_draft_entries, 0));
  return l.kv.size() > draft ? l.kv.size() - draft : 0;
}

size_t CountOf(const RankLayout& l, int32_t layer_id) {
  return static_cast<size_t>(std::count(l.kv_layer_ids.begin(), l.kv_layer_ids.end(), layer_id));
}

// "layer 3 (K)" by range, "model layer 3 (kv[5])" by id.
std::string DescribeKvBuffer(const RankLayout& l, size_t i) {
  if (!l.kv_layer_ids.empty()) return fmt::format("model layer {} (kv[{}])", l.kv_layer_ids[i], i);
  if (IsDraftKv(l, i)) return fmt::format("draft entry {} (kv[{}])", i - TargetKvCount(l), i);
  const size_t np = static_cast<size_t>(NumLayers(l));
  if (l.is_mla || np == 0) return fmt::format("layer {}", l.start_layer + static_cast<int>(i));
  return fmt::format("layer {} ({})", l.start_layer + static_cast<int>(i % np), i < np ? "K" : "V");
}

Status CheckBuffers(const std::vector<BufferSpan>& buffers, const char* what) {
  for (size_t i = 0; i < buffers.size(); ++i) {
    const BufferSpan& b = buffers[i];
    if (b.item_len == 0) return FailedPreconditionError(fmt::format("{}[{}] item_len 0", what, i));
    if (b.length < b.item_len) {
      return FailedPreconditionError(fmt::format(
          "{}[{}] length {} shorter than one item of {} bytes", what, i, b.length, b.item_len));
    }
  }
  return Status::Ok();
}

// Buffers of one class must agree item by item: the receiver lays rows and
// slots out exactly as the sender does.
Status CheckSameItems(const std::vector<BufferSpan>& p, const std::vector<BufferSpan>& d,
                      const char* what) {
  if (p.size() != d.size()) {
    return FailedPreconditionError(
        fmt::format("{} buffer count mismatch: prefill {}, decode {}", what, p.size(), d.size()));
  }
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i].item_len != d[i].item_len) {
      return FailedPreconditionError(fmt::format("{}[{}] item_len mismatch: prefill {}, decode {}",
                                                 what, i, p[i].item_len, d[i].item_len));
    }
  }
  return Status::Ok();
}

// Without layer ids, the kv buffers before the draft entries are the layer
// range: one per layer (MLA) or K then V per layer (MHA).
Status CheckRangeCount(const RankLayout& l) {
  const size_t expected_buffers = static_cast<size_t>(NumLayers(l)) * (l.is_mla ? 1 : 2);
  if (TargetKvCount(l) != expected_buffers) {
    return FailedPreconditionError(fmt::format(
        "kv buffer count {} for {} layers [{}, {}) ({}), expected {}{}", TargetKvCount(l),
        NumLayers(l), l.start_layer, l.end_layer, l.is_mla ? "MLA" : "MHA K and V",
        expected_buffers,
        l.num_draft_entries > 0 ? fmt::format(" (and {} draft entries)", l.num_draft_entries)
                                : ""));
  }
  return Status::Ok();
}

// sglang's rule: each prefill buffer takes decode's earliest unused buffer
// of the same model layer (so K pairs with K and V with V).
Result<std::vector<uint32_t>> PairByLayerId(const RankLayout& prefill, const RankLayout& decode) {
  std::unordered_map<int32_t, std::deque<uint32_t>> unused;
  for (size_t d = 0; d < decode.kv_layer_ids.size(); ++d)
    unused[decode.kv_layer_ids[d]].push_back(static_cast<uint32_t>(d));
  std::vector<uint32_t> pairs(prefill.kv_layer_ids.size());
  for (size_t p = 0; p < pairs.size(); ++p) {
    auto it = unused.find(prefill.kv_layer_ids[p]);
    if (it == unused.end() || it->second.empty()) {
      const size_t held = it == unused.end() ? 0 : CountOf(decode, it->first);
      return FailedPreconditionError(fmt::format(
          "decode holds no kv buffer for model layer {} (prefill kv[{}]): {}",
          prefill.kv_layer_ids[p], p,
          held == 0 ? "decode's kv_layer_ids do not name that layer"
                    : fmt::format("decode's {} buffer(s) of that layer are taken by prefill's "
                                  "earlier ones",
                                  held)));
    }
    pairs[p] = it->second.front();
    it->second.pop_front();
  }
  return pairs;
}

// By layer range: layer l's K (and V) of prefill into layer l's of decode.
Result<std::vector<uint32_t>> PairByRange(const RankLayout& prefill, const RankLayout& decode) {
  KVB_RETURN_IF_ERROR(CheckRangeCount(prefill).WithContext("prefill layout"));
  KVB_RETURN_IF_ERROR(CheckRangeCount(decode).WithContext("decode layout"));
  if (prefill.start_layer < decode.start_layer || prefill.end_layer > decode.end_layer) {
    return FailedPreconditionError(fmt::format(
        "layer range mismatch: prefill [{}, {}), decode [{}, {}) (decode must hold every prefill "
        "layer)",
        prefill.start_layer, prefill.end_layer, decode.start_layer, decode.end_layer));
  }
  const int np = NumLayers(prefill);
  const int nd = NumLayers(decode);
  const int offset = prefill.start_layer - decode.start_layer;
  std::vector<uint32_t> pairs;
  pairs.reserve(prefill.kv.size());
  for (int half = 0; half < (prefill.is_mla ? 1 : 2); ++half)
    for (int i = 0; i < np; ++i) pairs.push_back(static_cast<uint32_t>(half * nd + i + offset));
  // The draft entries, tail to tail.
  if (prefill.num_draft_entries != decode.num_draft_entries)
    return FailedPreconditionError(
        fmt::format("draft entry count mismatch: prefill {}, decode {} (without kv_layer_ids "
                    "they pair tail to tail)",
                    prefill.num_draft_entries, decode.num_draft_entries));
  for (size_t j = 0; j < static_cast<size_t>(prefill.num_draft_entries); ++j)
    pairs.push_back(static_cast<uint32_t>(TargetKvCount(decode) + j));
  return pairs;
}

// Range pairing takes target kv buffer i of `l` for layer start + i % n
// (K then V; MLA once). Ids that say otherwise (a pool listed by
// compression bucket, a hybrid pool's layers) would be contradicted.
Status CheckIdsFollowRange(const RankLayout& l, const char* side) {
  const int n = NumLayers(l);
  for (size_t i = 0; i < TargetKvCount(l) && i < l.kv_layer_ids.size() && n > 0; ++i) {
    const int64_t range = l.start_layer + static_cast<int64_t>(i % static_cast<size_t>(n));
    if (l.kv_layer_ids[i] == range) continue;
    return FailedPreconditionError(fmt::format(
        "{} kv[{}] holds model layer {} by its kv_layer_ids, but pairing by layer range (the "
        "other side gave none) would take it for layer {}; give both sides kv_layer_ids",
        side, i, l.kv_layer_ids[i], range));
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<uint32_t>> PairKvBuffers(const RankLayout& prefill, const RankLayout& decode) {
  const bool p_ids = !prefill.kv_layer_ids.empty();
  const bool d_ids = !decode.kv_layer_ids.empty();
  if (p_ids && d_ids) return PairByLayerId(prefill, decode);
  auto pairs = PairByRange(prefill, decode);
  if (p_ids == d_ids) return pairs;
  const std::string context =
      fmt::format("kv_layer_ids given by {} only, so buffers pair by layer range",
                  p_ids ? "prefill" : "decode");
  if (!pairs.ok()) return pairs.status().WithContext(context);
  Status follows =
      p_ids ? CheckIdsFollowRange(prefill, "prefill") : CheckIdsFollowRange(decode, "decode");
  if (!follows.ok()) return follows.WithContext(context);
  return pairs;
}

bool IsDraftKv(const RankLayout& l, size_t b) { return b < l.kv.size() && b >= TargetKvCount(l); }

Status CheckLayout(const RankLayout& l) {
  if (l.num_draft_entries < 0 || static_cast<size_t>(l.num_draft_entries) > l.kv.size())
    return FailedPreconditionError(
        fmt::format("num_draft_entries {} out of range [0, {}] (kv buffers)", l.num_draft_entries,
                    l.kv.size()));
  if (l.page_size < 1) return FailedPreconditionError(fmt::format("page_size {} < 1", l.page_size));
  if (l.tp_size < 1) return FailedPreconditionError(fmt::format("tp_size {} < 1", l.tp_size));
  if (l.tp_rank < 0 || l.tp_rank >= l.tp_size) {
    return FailedPreconditionError(
        fmt::format("tp_rank {} out of range [0, {})", l.tp_rank, l.tp_size));
  }
  if (l.total_kv_heads < 1) {
    return FailedPreconditionError(fmt::format("total_kv_heads {} < 1", l.total_kv_heads));
  }
  if (l.start_layer < 0) {
    return FailedPreconditionError(fmt::format("start_layer {} < 0", l.start_layer));
  }
  if (l.end_layer <= l.start_layer) {
    return FailedPreconditionError(fmt::format("layer range [{}, {}) is empty: end_layer {} <= {}",
                                               l.start_layer, l.end_layer, l.end_layer,
                                               l.start_layer));
  }
  if (l.cp_size < 1) return FailedPreconditionError(fmt::format("cp_size {} < 1", l.cp_size));
  if (l.dcp_size < 1 || l.dcp_rank < 0 || l.dcp_rank >= l.dcp_size) {
    return FailedPreconditionError(
        fmt::format("dcp_rank {} out of range [0, dcp_size {})", l.dcp_rank, l.dcp_size));
  }
  if (l.dcp_size > 1 && !l.is_mla) {
    return FailedPreconditionError(fmt::format(
        "dcp_size {} without MLA: decode context parallelism is moved for an MLA cache only "
        "(sglang refuses it for MHA/GQA too)",
        l.dcp_size));
  }
  const int expected_heads =
      l.is_mla ? 1 : HeadsOfRank(l.total_kv_heads, l.tp_size, l.tp_rank).count;
  if (l.kv_heads != expected_heads) {
    return FailedPreconditionError(
        l.is_mla ? fmt::format("kv_heads {} for MLA, expected 1", l.kv_heads)
                 : fmt::format("kv_heads {} for tp rank {} of {} with {} total kv heads, "
                               "expected {}",
                               l.kv_heads, l.tp_rank, l.tp_size, l.total_kv_heads, expected_heads));
  }
  if (l.kv_layer_ids.empty()) {
    KVB_RETURN_IF_ERROR(CheckRangeCount(l));
  } else if (l.kv_layer_ids.size() != l.kv.size()) {
    return FailedPreconditionError(fmt::format("kv_layer_ids has {} entries for {} kv buffers",
                                               l.kv_layer_ids.size(), l.kv.size()));
  }
  for (size_t i = 0; i < l.kv_layer_ids.size(); ++i) {
    if (l.kv_layer_ids[i] < 0)
      return FailedPreconditionError(
          fmt::format("kv_layer_ids[{}] is {}: layer ids are >= 0", i, l.kv_layer_ids[i]));
  }
  KVB_RETURN_IF_ERROR(CheckBuffers(l.kv, "kv"));
  const uint64_t per_page = static_cast<uint64_t>(l.page_size) * static_cast<uint64_t>(l.kv_heads);
  for (size_t i = 0; i < l.kv.size(); ++i) {
    if (l.kv[i].item_len % per_page != 0) {
      return FailedPreconditionError(
          fmt::format("kv[{}] item_len {} not divisible by page_size {} * kv_heads {}", i,
                      l.kv[i].item_len, l.page_size, l.kv_heads));
    }
  }
  KVB_RETURN_IF_ERROR(CheckBuffers(l.aux, "aux"));
  KVB_RETURN_IF_ERROR(CheckBuffers(l.state, "state"));
  KVB_RETURN_IF_ERROR(planning::CheckStateMeta(l));
  return planning::CheckStateSharding(l);
}

Status CheckCompatible(const RankLayout& prefill, const RankLayout& decode) {
  return CompatiblePairs(prefill, decode).status();
}

Result<std::vector<uint32_t>> CompatiblePairs(const RankLayout& prefill, const RankLayout& decode) {
  KVB_RETURN_IF_ERROR(CheckLayout(prefill).WithContext("prefill layout"));
  KVB_RETURN_IF_ERROR(CheckLayout(decode).WithContext("decode layout"));
  auto mismatch = [](const char* what, const auto& p, const auto& d) {
    return FailedPreconditionError(fmt::format("{} mismatch: prefill {}, decode {}", what, p, d));
  };
  if (prefill.is_mla != decode.is_mla) return mismatch("is_mla", prefill.is_mla, decode.is_mla);
  if (prefill.cp_size > 1 && prefill.all_cp_ranks != decode.all_cp_ranks) {
    auto on = [](bool b) { return b ? "every cp rank sends" : "cp rank 0 sends"; };
    return FailedPreconditionError(fmt::format(
        "cp transfer mode mismatch: prefill (cp size {}) {}, decode {}; set "
        "SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER (or a hybrid MLA backend) alike on both "
        "servers",
        prefill.cp_size, on(prefill.all_cp_ranks), on(decode.all_cp_ranks)));
  }
  if (prefill.dcp_size != 1) {
    return FailedPreconditionError(
        fmt::format("prefill dcp_size {}: decode context parallelism is for decode; a prefill "
                    "server runs with dcp_size 1",
                    prefill.dcp_size));
  }
  if (prefill.page_size != decode.page_size) {
    return mismatch("page size", prefill.page_size, decode.page_size);
  }
  if (prefill.dtype != decode.dtype) {
    return mismatch("dtype", fmt::format("'{}'", prefill.dtype), fmt::format("'{}'", decode.dtype));
  }
  if (prefill.total_kv_heads != decode.total_kv_heads) {
    return mismatch("total kv heads", prefill.total_kv_heads, decode.total_kv_heads);
  }
  KVB_ASSIGN_OR_RETURN(std::vector<uint32_t> pairs, PairKvBuffers(prefill, decode));
  // Bytes per head per token, compared for every buffer prefill sends. Under
  // decode dcp a draft entry's decode page holds dcp_size of prefill's.
  for (size_t i = 0; i < pairs.size(); ++i) {
    const BufferSpan& p = prefill.kv[i];
    const BufferSpan& d = decode.kv[pairs[i]];
    const bool draft = IsDraftKv(prefill, i);
    if (decode.dcp_size > 1 && draft != IsDraftKv(decode, pairs[i]))
      return FailedPreconditionError(fmt::format(
          "draft entry mismatch under dcp: {} is {} on prefill, {} is {} on decode",
          DescribeKvBuffer(prefill, i), draft ? "a draft entry" : "the target's",
          DescribeKvBuffer(decode, pairs[i]), draft ? "the target's" : "a draft entry"));
    const uint64_t widen = draft && decode.dcp_size > 1 ? uint64_t(decode.dcp_size) : 1;
    const uint64_t p_bytes = p.item_len / (uint64_t(prefill.page_size) * prefill.kv_heads);
    const uint64_t d_per = uint64_t(decode.page_size) * decode.kv_heads * widen;
    const uint64_t d_bytes = d.item_len % d_per == 0 ? d.item_len / d_per : 0;
    if (p_bytes != d_bytes) {
      return FailedPreconditionError(
          fmt::format("bytes per head per token mismatch for {}: prefill {}, decode {}",
                      DescribeKvBuffer(prefill, i), p_bytes, d_bytes));
    }
  }
  KVB_RETURN_IF_ERROR(CheckSameItems(prefill.aux, decode.aux, "aux"));
  KVB_RETURN_IF_ERROR(planning::CheckStateCompatible(prefill, decode));
  return pairs;
}

HeadRange HeadsOfRank(int total_heads, int tp_size, int rank) {
  if (total_heads < 1 || tp_size < 1 || rank < 0 || rank >= tp_size) return {};
  // 64-bit products: rank * total_heads cannot overflow for any int inputs.
  const int64_t t = total_heads;
  const int first = static_cast<int>(rank * t / tp_size);
  if (tp_size >= total_heads) return {first, 1};  // replicated (or exactly one each)
  // sglang requires total_heads % tp_size == 0 here; the balanced split is
  // the same in that case and stays well defined otherwise.
  const int end = static_cast<int>((rank + 1) * t / tp_size);
  return {first, end - first};
}

namespace {

// State slices (num_heads 0) for the pairs whose shares of a sliced axis
// overlap and that have no head flow; `flows` (ordered by decode rank) keep
// their order. Decode rank d's overlapping prefill ranks are the range
// [d * Tp / Td, ceil((d + 1) * Tp / Td)), so the work is linear in the flows.
void AddStateFlows(std::vector<HeadSlice>& flows, int prefill_tp, int decode_tp) {
  const int64_t pt = prefill_tp, dt = decode_tp;
  std::vector<HeadSlice> all;
  size_t next = 0;
  for (int d = 0; d < decode_tp; ++d) {
    const size_t first = next;
    while (next < flows.size() && flows[next].decode_rank == d) all.push_back(flows[next++]);
    const int64_t p_end = ((d + 1) * pt + dt - 1) / dt;
    for (int64_t p = d * pt / dt; p < p_end; ++p) {
      const bool overlap = p * dt < (d + 1) * pt && d * pt < (p + 1) * dt;
      const bool has = std::any_of(flows.begin() + static_cast<std::ptrdiff_t>(first),
                                   flows.begin() + static_cast<std::ptrdiff_t>(next),
                                   [&](const HeadSlice& f) { return f.prefill_rank == p; });
      if (overlap && !has) all.push_back({static_cast<int>(p), d, 0, 0, 0});
    }
  }
  flows = std::move(all);
}

Result<std::vector<HeadSlice>> HeadFlows(int prefill_tp, int decode_tp, int total_heads,
                                         bool is_mla) {
  if (prefill_tp < 1 || decode_tp < 1 || total_heads < 1) {
    return InvalidArgumentError(
        fmt::format("bad flow shape: prefill_tp {}, decode_tp {}, total_heads {} (each must be "
                    ">= 1)",
                    prefill_tp, decode_tp, total_heads));
  }
  std::vector<HeadSlice> flows;
  if (is_mla) {
    flows.reserve(decode_tp);
    for (int d = 0; d < decode_tp; ++d) flows.push_back({d % prefill_tp, d, 0, 0, 1});
    return flows;
  }
  // owners[h]: the prefill ranks holding global head h, ascending.
  std::vector<std::vector<int>> owners(total_heads);
  std::vector<HeadRange> prefill_heads(prefill_tp);
  for (int p = 0; p < prefill_tp; ++p) {
    prefill_heads[p] = HeadsOfRank(total_heads, prefill_tp, p);
    for (int k = 0; k < prefill_heads[p].count; ++k)
      owners[prefill_heads[p].first + k].push_back(p);
  }
  for (int d = 0; d < decode_tp; ++d) {
    const HeadRange mine = HeadsOfRank(total_heads, decode_tp, d);
    for (int k = 0; k < mine.count; ++k) {
      const int head = mine.first + k;
      const std::vector<int>& candidates = owners[head];
      const int p = candidates[d % candidates.size()];
      const int src = head - prefill_heads[p].first;
      HeadSlice* last = flows.empty() ? nullptr : &flows.back();
      if (last != nullptr && last->decode_rank == d && last->prefill_rank == p &&
          last->src_head + last->num_heads == src && last->dst_head + last->num_heads == k) {
        ++last->num_heads;
      } else {
        flows.push_back({p, d, src, k, 1});
      }
    }
  }
  return flows;
}

}  // namespace

Result<std::vector<HeadSlice>> ComputeFlows(int prefill_tp, int decode_tp, int total_heads,
                                            bool is_mla, bool state_sliced) {
  KVB_ASSIGN_OR_RETURN(std::vector<HeadSlice> flows,
                       HeadFlows(prefill_tp, decode_tp, total_heads, is_mla));
  if (state_sliced) AddStateFlows(flows, prefill_tp, decode_tp);
  return flows;
}

std::vector<HeadSlice> FlowsToDecode(std::span<const HeadSlice> flows, int decode_rank) {
  std::vector<HeadSlice> out;
  for (const HeadSlice& f : flows) {
    if (f.decode_rank == decode_rank) out.push_back(f);
  }
  return out;
}

std::vector<HeadSlice> FlowsFromPrefill(std::span<const HeadSlice> flows, int prefill_rank) {
  std::vector<HeadSlice> out;
  for (const HeadSlice& f : flows) {
    if (f.prefill_rank == prefill_rank) out.push_back(f);
  }
  return out;
}

Result<std::vector<int>> PrefillStagesOfDecode(int prefill_pp, int decode_pp, int decode_pp_rank) {
  if (prefill_pp < 1 || decode_pp < 1 || decode_pp_rank < 0 || decode_pp_rank >= decode_pp) {
    return InvalidArgumentError(fmt::format("bad pp shape: prefill pp {}, decode pp rank {} of {}",
                                            prefill_pp, decode_pp_rank, decode_pp));
  }
  if (decode_pp == prefill_pp) return std::vector<int>{decode_pp_rank};
  if (decode_pp != 1) {
    return FailedPreconditionError(
        fmt::format("pp size mismatch: prefill {}, decode {} (decode pp size must be 1 or equal "
                    "to prefill's)",
                    prefill_pp, decode_pp));
  }
  std::vector<int> stages(prefill_pp);
  for (int s = 0; s < prefill_pp; ++s) stages[s] = s;
  return stages;
}

bool LastStageRead(int pp_rank, int pp_size, int decode_pp) {
  return pp_rank == pp_size - 1 || decode_pp == pp_size;
}

Status CheckPageIndices(const RankLayout& layout, std::span<const int32_t> pages, bool unique) {
  uint64_t bound = layout.kv.empty() ? 0 : UINT64_MAX;
  for (const BufferSpan& b : layout.kv) {
    bound = std::min(bound, b.item_len == 0 ? 0 : b.length / b.item_len);
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    if (pages[i] < 0 || static_cast<uint64_t>(pages[i]) >= bound) {
      return InvalidArgumentError(
          fmt::format("page index {} at position {} out of range [0, {})", pages[i], i, bound));
    }
  }
  if (!unique || pages.size() < 2) return Status::Ok();
  // Sort (value, position) so the error names the earliest repeated position,
  // whatever the value.
  std::vector<std::pair<int32_t, size_t>> sorted(pages.size());
  for (size_t i = 0; i < pages.size(); ++i) sorted[i] = {pages[i], i};
  std::sort(sorted.begin(), sorted.end());
  size_t bad = pages.size();
  size_t first_of_bad = 0;
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i].first == sorted[i - 1].first && sorted[i].second < bad) {
      bad = sorted[i].second;
      // The first occurrence is the smallest position of this value.
      size_t j = i - 1;
      while (j > 0 && sorted[j - 1].first == sorted[i].first) --j;
      first_of_bad = sorted[j].second;
    }
  }
  if (bad == pages.size()) return Status::Ok();
  return InvalidArgumentError(fmt::format("duplicate page index {} at position {} (first at {})",
                                          pages[bad], bad, first_of_bad));
}

}  // namespace kvbridge::internal
