// State planning: which bytes of which state slot go where, whole or as the
// slices of a tp-sharded axis (plan.h, StateSharding).
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "engine/plan.h"
#include "engine/plan_util.h"

namespace kvbridge::internal {
namespace {

using planning::Append;
using planning::CheckIndex;
using planning::CheckSameLength;
using planning::ItemCapacity;

const StateSharding* ShardingOf(const RankLayout& l, size_t b) {
  if (b >= l.state_sharding.size() || l.state_sharding[b].dim == 0) return nullptr;
  return &l.state_sharding[b];
}

// The full (all ranks) sizes of the sub-blocks of a sharded axis.
std::vector<uint64_t> FullGroups(const StateSharding& s, int tp_size) {
  if (s.groups.empty()) return {uint64_t{s.dim} * static_cast<uint64_t>(tp_size)};
  return {s.groups.begin(), s.groups.end()};
}

// Bytes of one element of the sliced axis (the axes after it included).
uint64_t ElementBytes(const BufferSpan& b, const StateSharding& s) {
  return b.item_len / (uint64_t{s.outer} * s.dim);
}

// Appends the runs that move, for each outer block and each sub-block, the
// elements that prefill rank p of tp Tp and decode rank d of tp Td both
// hold: sub-block g is [r * g / T, (r + 1) * g / T) on rank r of T, and a
// rank keeps its shares of the sub-blocks one after another.
void AppendSlices(std::vector<CopyRun>& runs, uint32_t b, uint32_t db, const RankLayout& prefill,
                  const RankLayout& decode, uint64_t src_slot, uint64_t dst_slot) {
  const StateSharding& ps = *ShardingOf(prefill, b);
  const StateSharding& ds = *ShardingOf(decode, db);
  const uint64_t e = ElementBytes(prefill.state[b], ps);
  const uint64_t tp = static_cast<uint64_t>(prefill.tp_size);
  const uint64_t td = static_cast<uint64_t>(decode.tp_size);
  const uint64_t p = static_cast<uint64_t>(prefill.tp_rank);
  const uint64_t d = static_cast<uint64_t>(decode.tp_rank);
  const std::vector<uint64_t> groups = FullGroups(ps, prefill.tp_size);
  for (uint64_t o = 0; o < ps.outer; ++o) {
    uint64_t src_at = src_slot * prefill.state[b].item_len + o * ps.dim * e;
    uint64_t dst_at = dst_slot * decode.state[db].item_len + o * ds.dim * e;
    for (uint64_t g : groups) {
      const uint64_t src_first = p * g / tp, src_end = (p + 1) * g / tp;
      const uint64_t dst_first = d * g / td, dst_end = (d + 1) * g / td;
      const uint64_t lo = std::max(src_first, dst_first), hi = std::min(src_end, dst_end);
      if (lo < hi) {
        Append(runs, {BufferClass::kState, b, src_at + (lo - src_first) * e, db,
                      dst_at + (lo - dst_first) * e, (hi - lo) * e});
      }
      src_at += (src_end - src_first) * e;
      dst_at += (dst_end - dst_first) * e;
    }
  }
}

int32_t TypeOf(const RankLayout& l, size_t b) {
  return l.state_types.empty() ? 0 : l.state_types[b];
}

int32_t NumTypes(const RankLayout& l) {
  return l.state_types.empty() ? 1
                               : *std::max_element(l.state_types.begin(), l.state_types.end()) + 1;
}

// Whether type t's buffers carry layer ids (CheckStateMeta: all or none).
bool TypeHasIds(const RankLayout& l, int32_t t) {
  for (size_t b = 0; b < l.state_layer_ids.size(); ++b)
    if (TypeOf(l, b) == t) return l.state_layer_ids[b] >= 0;
  return false;
}

// "state type t", with its name when it has one.
std::string TypeLabel(const RankLayout& l, int32_t t) {
  if (l.state_type_names.empty()) return fmt::format("state type {}", t);
  return fmt::format("state type {} ({})", t, l.state_type_names[static_cast<size_t>(t)]);
}

// Decode's type for each prefill type: by name and occurrence when both
// sides name their types, else by position.
Result<std::vector<int32_t>> PairTypes(const RankLayout& prefill, const RankLayout& decode) {
  const int32_t types = NumTypes(prefill);
  std::vector<int32_t> to(static_cast<size_t>(types));
  const std::vector<std::string>& pn = prefill.state_type_names;
  const std::vector<std::string>& dn = decode.state_type_names;
  if (pn.empty() || dn.empty()) {
    if (types != NumTypes(decode))
      return FailedPreconditionError(fmt::format(
          "state type count mismatch: prefill {}, decode {}{}", types, NumTypes(decode),
          pn.empty() == dn.empty()
              ? ""
              : fmt::format(" (state type names given by {} only, so types pair by position)",
                            pn.empty() ? "decode" : "prefill")));
    for (int32_t t = 0; t < types; ++t) to[static_cast<size_t>(t)] = t;
    return to;
  }
  for (size_t t = 0; t < pn.size(); ++t) {
    // sglang leaves such a component out; it has nothing to pair.
    if (std::none_of(prefill.state_types.begin(), prefill.state_types.end(),
                     [&](int32_t x) { return x == static_cast<int32_t>(t); }) &&
        !prefill.state_types.empty()) {
      to[t] = -1;
      continue;
    }
    const auto occurrence =
        std::count(pn.begin(), pn.begin() + static_cast<ptrdiff_t>(t) + 1, pn[t]);
    int64_t seen = 0;
    size_t d = 0;
    while (d < dn.size() && (dn[d] != pn[t] || ++seen < occurrence)) ++d;
    if (d == dn.size())
      return FailedPreconditionError(fmt::format(
          "decode holds no state component {} (occurrence {}) for prefill's state type {}; "
          "decode's components: {}",
          pn[t], occurrence, t, fmt::join(dn, ", ")));
    to[t] = static_cast<int32_t>(d);
  }
  return to;
}

// Pairs the buffers of prefill's type t (decode's type out.type_dst[t]): by
// layer id when both sides name them, else by position.
Status PairType(const RankLayout& prefill, const RankLayout& decode, int32_t t, StatePairs& out) {
  const int32_t dt = out.type_dst[static_cast<size_t>(t)];
  std::vector<uint32_t> src, dst;
  for (size_t b = 0; b < prefill.state.size(); ++b)
    if (TypeOf(prefill, b) == t) src.push_back(static_cast<uint32_t>(b));
  for (size_t b = 0; b < decode.state.size(); ++b)
    if (TypeOf(decode, b) == dt) dst.push_back(static_cast<uint32_t>(b));
  const bool p_ids = TypeHasIds(prefill, t), d_ids = TypeHasIds(decode, dt);
  // A pipeline stage may hold none of the layers decode names.
  if (src.empty() && d_ids) return Status::Ok();
  if (p_ids && d_ids) {
    std::vector<bool> taken(dst.size(), false);
    for (uint32_t p : src) {
      const int32_t layer = prefill.state_layer_ids[p];
      size_t k = 0;
      while (k < dst.size() && (taken[k] || decode.state_layer_ids[dst[k]] != layer)) ++k;
      if (k == dst.size())
        return FailedPreconditionError(
            fmt::format("decode holds no state buffer of {} for model layer {} (prefill "
                        "state[{}]): decode's state_layer_ids {} that layer",
                        TypeLabel(prefill, t), layer, p,
                        std::any_of(dst.begin(), dst.end(),
                                    [&](uint32_t d) { return decode.state_layer_ids[d] == layer; })
                            ? "name earlier prefill buffers of"
                            : "do not name"));
      taken[k] = true;
      out.dst[p] = dst[k];
      out.by_layer_id[p] = true;
    }
    return Status::Ok();
  }
  if (src.size() != dst.size()) {
    std::string why = p_ids != d_ids ? fmt::format(
                                           " (state_layer_ids given by {} only, so they "
                                           "pair by position)",
                                           p_ids ? "prefill" : "decode")
                                     : "";
    return FailedPreconditionError(fmt::format(
        "state buffer count mismatch{}: prefill {}, decode {}{}",
        NumTypes(prefill) > 1 ? " for " + TypeLabel(prefill, t) : "", src.size(), dst.size(), why));
  }
  for (size_t i = 0; i < src.size(); ++i) out.dst[src[i]] = dst[i];
  return Status::Ok();
}

}  // namespace

bool SlicedStateBuffer(const RankLayout& prefill, const RankLayout& decode, size_t p, size_t d) {
  return prefill.tp_size != decode.tp_size && ShardingOf(prefill, p) != nullptr &&
         ShardingOf(decode, d) != nullptr;
}

Result<StatePairs> PairStateBuffers(const RankLayout& prefill, const RankLayout& decode) {
  StatePairs out{std::vector<uint32_t>(prefill.state.size(), 0),
                 std::vector<bool>(prefill.state.size(), false),
                 {}};
  KVB_ASSIGN_OR_RETURN(out.type_dst, PairTypes(prefill, decode));
  for (int32_t t = 0; t < NumTypes(prefill); ++t)
    if (out.type_dst[static_cast<size_t>(t)] >= 0)
      KVB_RETURN_IF_ERROR(PairType(prefill, decode, t, out));
  return out;
}

bool StateSlicedFor(const RankLayout& decode, int prefill_tp) {
  if (prefill_tp == decode.tp_size) return false;
  for (size_t b = 0; b < decode.state.size(); ++b)
    if (ShardingOf(decode, b) != nullptr) return true;
  return false;
}

namespace planning {

Status CheckStateSharding(const RankLayout& l) {
  if (l.state_sharding.empty()) return Status::Ok();
  if (l.state_sharding.size() != l.state.size())
    return FailedPreconditionError(fmt::format("state sharding for {} buffers, the layout has {}",
                                               l.state_sharding.size(), l.state.size()));
  for (size_t b = 0; b < l.state.size(); ++b) {
    const StateSharding& s = l.state_sharding[b];
    if (s.dim == 0) continue;
    if (s.outer == 0 || l.state[b].item_len % (uint64_t{s.outer} * s.dim) != 0)
      return FailedPreconditionError(
          fmt::format("state[{}] item_len {} is not {} outer block(s) of {} elements", b,
                      l.state[b].item_len, s.outer, s.dim));
    if (s.groups.size() > kMaxStateGroups)
      return FailedPreconditionError(fmt::format("state[{}] has {} sub-blocks, at most {}", b,
                                                 s.groups.size(), kMaxStateGroups));
    uint64_t share = 0;
    for (uint32_t g : s.groups) {
      if (g == 0 || g % static_cast<uint64_t>(l.tp_size) != 0)
        return FailedPreconditionError(fmt::format(
            "state[{}] sub-block of {} elements does not split across {} ranks", b, g, l.tp_size));
      share += g / static_cast<uint64_t>(l.tp_size);
    }
    if (!s.groups.empty() && share != s.dim)
      return FailedPreconditionError(fmt::format(
          "state[{}] sub-blocks give this rank {} elements, its dim is {}", b, share, s.dim));
  }
  return Status::Ok();
}

// Names: none, or one per state type, each 1-64 printable ASCII characters.
static Status CheckStateTypeNames(const RankLayout& l) {
  const std::vector<std::string>& names = l.state_type_names;
  if (names.empty()) return Status::Ok();
  if (l.state.empty() || names.size() != static_cast<size_t>(NumTypes(l)))
    return FailedPreconditionError(fmt::format("state_type_names has {} entries for {} state types",
                                               names.size(), l.state.empty() ? 0 : NumTypes(l)));
  for (size_t t = 0; t < names.size(); ++t) {
    const std::string& s = names[t];
    if (s.empty() || s.size() > kMaxStateTypeName ||
        !std::all_of(s.begin(), s.end(), [](char c) { return c > ' ' && c < 127; }))
      return FailedPreconditionError(
          fmt::format("state_type_names[{}] ({} bytes) is not 1-{} printable characters without "
                      "spaces",
                      t, s.size(), kMaxStateTypeName));
  }
  return Status::Ok();
}

Status CheckStateMeta(const RankLayout& l) {
  const size_t n = l.state.size();
  if (!l.state_types.empty() && l.state_types.size() != n)
    return FailedPreconditionError(
        fmt::format("state_types has {} entries for {} state buffers", l.state_types.size(), n));
  for (size_t b = 0; b < l.state_types.size(); ++b)
    if (l.state_types[b] < 0 || static_cast<size_t>(l.state_types[b]) >= n)
      return FailedPreconditionError(
          fmt::format("state_types[{}] is {}, outside [0, {})", b, l.state_types[b], n));
  KVB_RETURN_IF_ERROR(CheckStateTypeNames(l));
  if (l.state_layer_ids.empty()) return Status::Ok();
  if (l.state_layer_ids.size() != n)
    return FailedPreconditionError(fmt::format(
        "state_layer_ids has {} entries for {} state buffers", l.state_layer_ids.size(), n));
  for (size_t b = 0; b < n; ++b) {
    if (l.state_layer_ids[b] < -1)
      return FailedPreconditionError(fmt::format(
          "state_layer_ids[{}] is {}: layer ids are >= 0 (-1: none)", b, l.state_layer_ids[b]));
    if ((l.state_layer_ids[b] >= 0) != TypeHasIds(l, TypeOf(l, b)))
      return FailedPreconditionError(
          fmt::format("state_layer_ids[{}] is {}: the buffers of state type {} have layer ids "
                      "all or none",
                      b, l.state_layer_ids[b], TypeOf(l, b)));
  }
  return Status::Ok();
}

Status CheckStateCompatible(const RankLayout& prefill, const RankLayout& decode) {
  KVB_ASSIGN_OR_RETURN(StatePairs pairs, PairStateBuffers(prefill, decode));
  for (size_t b = 0; b < prefill.state.size(); ++b) {
    const size_t d = pairs.dst[b];
    const std::string name =
        d == b ? fmt::format("state[{}]", b) : fmt::format("state[{}] (decode state[{}])", b, d);
    const StateSharding* ps = ShardingOf(prefill, b);
    const StateSharding* ds = ShardingOf(decode, d);
    const bool tp_differs = prefill.tp_size != decode.tp_size;
    if (tp_differs && (ps == nullptr) != (ds == nullptr))
      return FailedPreconditionError(
          fmt::format("{} is sharded across tp ranks on {} only (prefill tp {}, decode tp {})",
                      name, ps != nullptr ? "prefill" : "decode", prefill.tp_size, decode.tp_size));
    if (!SlicedStateBuffer(prefill, decode, b, d)) {
      if (prefill.state[b].item_len != decode.state[d].item_len)
        return FailedPreconditionError(fmt::format("{} item_len mismatch: prefill {}, decode {}",
                                                   name, prefill.state[b].item_len,
                                                   decode.state[d].item_len));
      continue;
    }
    const uint64_t p_full = uint64_t{ps->dim} * static_cast<uint64_t>(prefill.tp_size);
    const uint64_t d_full = uint64_t{ds->dim} * static_cast<uint64_t>(decode.tp_size);
    if (p_full != d_full || ps->outer != ds->outer || ps->groups != ds->groups ||
        ElementBytes(prefill.state[b], *ps) != ElementBytes(decode.state[d], *ds))
      return FailedPreconditionError(fmt::format(
          "{} sharding mismatch: prefill {} of {} elements x {} outer x {} B (sub-blocks "
          "{}), decode {} of {} x {} x {} B (sub-blocks {})",
          name, ps->dim, p_full, ps->outer, ElementBytes(prefill.state[b], *ps),
          fmt::join(ps->groups, ","), ds->dim, d_full, ds->outer,
          ElementBytes(decode.state[d], *ds), fmt::join(ds->groups, ",")));
  }
  return Status::Ok();
}

}  // namespace planning

Result<std::vector<std::span<const int32_t>>> StateSections(const std::vector<int32_t>& types,
                                                            std::span<const int32_t> slots) {
  const int num_types = types.empty() ? 1 : *std::max_element(types.begin(), types.end()) + 1;
  std::vector<std::span<const int32_t>> sections;
  size_t begin = 0;
  for (size_t i = 0; i <= slots.size(); ++i) {
    if (i < slots.size() && slots[i] != kStateSectionEnd) continue;
    sections.push_back(slots.subspan(begin, i - begin));
    begin = i + 1;
  }
  if (sections.size() == 1) return sections;  // no separator: every buffer
  if (num_types < 2 || static_cast<int>(sections.size()) != num_types) {
    return InvalidArgumentError(fmt::format(
        "state indices hold {} sections (separated by {}), the layout has {} state type(s)",
        sections.size(), kStateSectionEnd, num_types));
  }
  return sections;
}

Status CheckStateSlots(const char* what, const std::vector<BufferSpan>& bufs,
                       const std::vector<int32_t>& types, std::span<const int32_t> slots) {
  KVB_ASSIGN_OR_RETURN(auto sections, StateSections(types, slots));
  for (size_t t = 0; t < sections.size(); ++t) {
    std::vector<BufferSpan> own;  // the buffers this section addresses
    for (size_t b = 0; b < bufs.size(); ++b)
      if (sections.size() == 1 || (b < types.size() && types[b] == static_cast<int32_t>(t)))
        own.push_back(bufs[b]);
    const uint64_t bound = ItemCapacity(own);
    for (size_t i = 0; i < sections[t].size(); ++i) {
      Status s = CheckIndex(sections[t][i], bound, what, static_cast<int64_t>(i));
      if (!s.ok()) return sections.size() == 1 ? s : s.WithContext(fmt::format("state type {}", t));
    }
  }
  return Status::Ok();
}

Result<std::vector<CopyRun>> PlanState(const RankLayout& prefill, const RankLayout& decode,
                                       std::span<const int32_t> src_slots,
                                       std::span<const int32_t> dst_slots, StateShare share) {
  KVB_RETURN_IF_ERROR(CheckCompatible(prefill, decode));
  std::vector<CopyRun> runs;
  KVB_ASSIGN_OR_RETURN(StatePairs pairs, PairStateBuffers(prefill, decode));
  // A stage before the last sends only buffers paired by layer id: without
  // any, it sends no state and its slot list is not looked at.
  if (!share.last_stage &&
      std::none_of(pairs.by_layer_id.begin(), pairs.by_layer_id.end(), [](bool b) { return b; }))
    return runs;
  // Types paired by position have as many sections on both sides; by name,
  // a stage may hold fewer types than decode (each type's section is
  // checked below).
  const bool by_name = !prefill.state_type_names.empty() && !decode.state_type_names.empty();
  if (!by_name)
    KVB_RETURN_IF_ERROR(CheckSameLength(src_slots.size(), dst_slots.size(), "state slot"));
  // A model without state buffers (not hybrid) has nothing to send.
  if (prefill.state.empty()) return runs;
  KVB_RETURN_IF_ERROR(
      CheckStateSlots("source state slot", prefill.state, prefill.state_types, src_slots));
  KVB_RETURN_IF_ERROR(
      CheckStateSlots("destination state slot", decode.state, decode.state_types, dst_slots));
  KVB_ASSIGN_OR_RETURN(auto src, StateSections(prefill.state_types, src_slots));
  KVB_ASSIGN_OR_RETURN(auto dst, StateSections(decode.state_types, dst_slots));
  if (!by_name && src.size() != dst.size())
    return InvalidArgumentError(
        fmt::format("state sections: source {}, destination {}", src.size(), dst.size()));
  for (size_t b = 0; b < prefill.state.size(); ++b) {
    const auto type = static_cast<size_t>(TypeOf(prefill, b));
    const size_t t = src.size() == 1 ? 0 : type;  // prefill's section, and decode's:
    const size_t dt = dst.size() == 1 ? 0 : static_cast<size_t>(pairs.type_dst[type]);
    KVB_RETURN_IF_ERROR(CheckSameLength(src[t].size(), dst[dt].size(), "state slot")
                            .WithContext(fmt::format("state type {}", type)));
    const auto db = pairs.dst[b];
    const bool sliced = SlicedStateBuffer(prefill, decode, b, db);
    if (sliced ? !share.slices : !share.whole) continue;
    if (!share.last_stage && !pairs.by_layer_id[b]) continue;
    const uint64_t item = prefill.state[b].item_len;
    for (size_t i = 0; i < src[t].size(); ++i) {
      const auto src_slot = static_cast<uint64_t>(src[t][i]);
      const auto dst_slot = static_cast<uint64_t>(dst[dt][i]);
      if (sliced) {
        AppendSlices(runs, static_cast<uint32_t>(b), db, prefill, decode, src_slot, dst_slot);
        continue;
      }
      Append(runs, {BufferClass::kState, static_cast<uint32_t>(b), src_slot * item, db,
                    dst_slot * item, item});
    }
  }
  return runs;
}

}  // namespace kvbridge::internal
