#include "connector/layout_json.h"

#include <fmt/format.h>

#include <algorithm>

#include "connector/protocol.h"

namespace kvbridge::internal {
namespace {

nlohmann::json SpansToJson(const std::vector<BufferSpan>& spans) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& s : spans) a.push_back({s.addr, s.length, s.item_len});
  return a;
}

bool SpansFromJson(const nlohmann::json& j, std::vector<BufferSpan>* out) {
  if (!j.is_array()) return false;
  out->clear();
  for (const auto& e : j) {
    if (!e.is_array() || e.size() != 3) return false;
    for (const auto& v : e)
      if (!v.is_number_unsigned()) return false;
    out->push_back({e[0].get<uint64_t>(), e[1].get<uint64_t>(), e[2].get<uint64_t>()});
  }
  return true;
}

nlohmann::json ShardingToJson(const std::vector<StateSharding>& sharding) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& s : sharding) a.push_back({s.dim, s.outer, s.groups});
  return a;
}

// [[dim, outer, [groups...]], ...]; bounds only (CheckLayout judges the rest).
bool ShardingFromJson(const nlohmann::json& j, std::vector<StateSharding>* out) {
  if (!j.is_array() || j.size() > kMaxBuffers) return false;
  out->clear();
  for (const auto& e : j) {
    if (!e.is_array() || e.size() != 3 || !e[0].is_number_unsigned() ||
        !e[1].is_number_unsigned() || !e[2].is_array() || e[2].size() > kMaxStateGroups)
      return false;
    StateSharding s;
    for (const auto& v : {e[0], e[1]})
      if (v.get<uint64_t>() > UINT32_MAX) return false;
    s.dim = e[0].get<uint32_t>();
    s.outer = e[1].get<uint32_t>();
    for (const auto& g : e[2]) {
      if (!g.is_number_unsigned() || g.get<uint64_t>() > UINT32_MAX) return false;
      s.groups.push_back(g.get<uint32_t>());
    }
    out->push_back(std::move(s));
  }
  return true;
}

// [n, ...], each in [min, INT32_MAX] (layer ids, state types).
bool IntsFromJson(const nlohmann::json& j, std::vector<int32_t>* out, int64_t min = 0) {
  if (!j.is_array() || j.size() > kMaxBuffers) return false;
  out->clear();
  for (const auto& v : j) {
    if (!v.is_number_integer() || v.get<int64_t>() < min || v.get<int64_t>() > INT32_MAX)
      return false;
    out->push_back(v.get<int32_t>());
  }
  return true;
}

}  // namespace

nlohmann::json LayoutToJson(const RankLayout& l) {
  return {{"is_mla", l.is_mla},
          {"page_size", l.page_size},
          {"dtype", l.dtype},
          {"tp_size", l.tp_size},
          {"tp_rank", l.tp_rank},
          {"total_kv_heads", l.total_kv_heads},
          {"kv_heads", l.kv_heads},
          {"start_layer", l.start_layer},
          {"end_layer", l.end_layer},
          {"kv", SpansToJson(l.kv)},
          {"aux", SpansToJson(l.aux)},
          {"state", SpansToJson(l.state)},
          {"state_sharding", ShardingToJson(l.state_sharding)},
          {"kv_layer_ids", l.kv_layer_ids},
          {"state_types", l.state_types},
          {"state_layer_ids", l.state_layer_ids},
          {"state_type_names", l.state_type_names},
          {"cp_size", l.cp_size},
          {"all_cp_ranks", l.all_cp_ranks},
          {"num_draft_entries", l.num_draft_entries},
          {"mla_compression_ratios", l.mla_compression_ratios}};
}

Result<RankLayout> LayoutFromJson(const nlohmann::json& j) {
  if (!j.is_object()) return InvalidArgumentError("layout is not a JSON object");
  RankLayout l;
  auto get_int = [&](const char* name, int* v) -> Status {
    auto it = j.find(name);
    if (it == j.end() || !it->is_number_integer())
      return InvalidArgumentError(std::string("layout field '") + name + "' missing or not int");
    *v = it->get<int>();
    return Status();
  };
  auto mla = j.find("is_mla");
  auto dtype = j.find("dtype");
  if (mla == j.end() || !mla->is_boolean())
    return InvalidArgumentError("layout field 'is_mla' missing or not bool");
  if (dtype == j.end() || !dtype->is_string())
    return InvalidArgumentError("layout field 'dtype' missing or not a string");
  l.is_mla = mla->get<bool>();
  l.dtype = dtype->get<std::string>();
  KVB_RETURN_IF_ERROR(get_int("page_size", &l.page_size));
  KVB_RETURN_IF_ERROR(get_int("tp_size", &l.tp_size));
  KVB_RETURN_IF_ERROR(get_int("tp_rank", &l.tp_rank));
  KVB_RETURN_IF_ERROR(get_int("total_kv_heads", &l.total_kv_heads));
  KVB_RETURN_IF_ERROR(get_int("kv_heads", &l.kv_heads));
  KVB_RETURN_IF_ERROR(get_int("start_layer", &l.start_layer));
  KVB_RETURN_IF_ERROR(get_int("end_layer", &l.end_layer));
  for (auto [name, out] : {std::pair{"kv", &l.kv}, {"aux", &l.aux}, {"state", &l.state}}) {
    auto it = j.find(name);
    if (it == j.end() || !SpansFromJson(*it, out))
      return InvalidArgumentError(std::string("layout field '") + name + "' malformed");
  }
  // Optional: layouts published before state sharding have none.
  if (auto it = j.find("state_sharding");
      it != j.end() && !ShardingFromJson(*it, &l.state_sharding))
    return InvalidArgumentError("layout field 'state_sharding' malformed");
  // Optional too: one id >= 0 per kv buffer, or none.
  if (auto it = j.find("kv_layer_ids"); it != j.end()) {
    if (!IntsFromJson(*it, &l.kv_layer_ids) ||
        (!l.kv_layer_ids.empty() && l.kv_layer_ids.size() != l.kv.size()))
      return InvalidArgumentError("layout field 'kv_layer_ids' malformed");
  }
  // Optional: each model layer's compression (>= 0), or none.
  if (auto it = j.find("mla_compression_ratios");
      it != j.end() && !IntsFromJson(*it, &l.mla_compression_ratios))
    return InvalidArgumentError("layout field 'mla_compression_ratios' malformed");
  // Optional: a state type (>= 0) and a layer id (-1: none) per state
  // buffer, or none (CheckLayout judges the values).
  for (auto [name, out, min] : {std::tuple{"state_types", &l.state_types, int64_t{0}},
                                {"state_layer_ids", &l.state_layer_ids, int64_t{-1}}}) {
    auto it = j.find(name);
    if (it != j.end() &&
        (!IntsFromJson(*it, out, min) || (!out->empty() && out->size() != l.state.size())))
      return InvalidArgumentError(std::string("layout field '") + name + "' malformed");
  }
  // Optional: strings, at most one per state buffer (CheckLayout: one per
  // type, each 1-64 printable characters).
  if (auto it = j.find("state_type_names"); it != j.end()) {
    if (!it->is_array() || it->size() > l.state.size() ||
        !std::all_of(it->begin(), it->end(), [](const nlohmann::json& v) {
          return v.is_string() && v.get_ref<const std::string&>().size() <= kMaxStateTypeName;
        }))
      return InvalidArgumentError("layout field 'state_type_names' malformed");
    l.state_type_names = it->get<std::vector<std::string>>();
  }
  // Optional: prefill's cp size and transfer mode (none: cp 1, cp rank 0 sends).
  if (auto it = j.find("cp_size"); it != j.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > kMaxParallelSize)
      return InvalidArgumentError("layout field 'cp_size' malformed");
    l.cp_size = it->get<int>();
  }
  if (auto it = j.find("all_cp_ranks"); it != j.end()) {
    if (!it->is_boolean()) return InvalidArgumentError("layout field 'all_cp_ranks' malformed");
    l.all_cp_ranks = it->get<bool>();
  }
  // Optional: draft entries at the tail of kv (none: 0).
  if (auto it = j.find("num_draft_entries"); it != j.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 ||
        it->get<int64_t>() > static_cast<int64_t>(l.kv.size()))
      return InvalidArgumentError("layout field 'num_draft_entries' malformed");
    l.num_draft_entries = it->get<int>();
  }
  return l;
}

namespace {

std::vector<BufferSpan> Spans(const std::vector<uint64_t>& ptrs, const std::vector<uint64_t>& lens,
                              const std::vector<uint64_t>& items) {
  std::vector<BufferSpan> out;
  for (size_t i = 0; i < ptrs.size(); ++i) out.push_back({ptrs[i], lens[i], items[i]});
  return out;
}

}  // namespace

Result<RankLayout> LayoutFromOptions(const ManagerOptions& opts) {
  const KVArgs& a = opts.args;
  const ParallelLayout& p = opts.parallel;
  RankLayout layout;
  layout.is_mla = opts.is_mla;
  layout.page_size = a.page_size;
  layout.dtype = a.dtype;
  layout.tp_size = p.tp_size;
  layout.tp_rank = p.tp_rank;
  layout.pp_size = p.pp_size;
  layout.dcp_size = p.dcp_size;
  layout.dcp_rank = p.dcp_rank;
  layout.cp_size = p.cp_size;
  layout.all_cp_ranks = p.all_cp_ranks;
  if (opts.role == Role::kPrefill && p.dcp_size != 1)
    return InvalidArgumentError(fmt::format(
        "dcp_size {} on a prefill rank: decode context parallelism is for decode", p.dcp_size));
  layout.total_kv_heads = a.total_kv_head_num;
  layout.kv_heads = opts.is_mla ? 1 : a.kv_head_num;
  int per_layer = opts.is_mla ? 1 : 2;
  layout.start_layer = a.prefill_start_layer;
  layout.end_layer =
      a.prefill_end_layer >= 0
          ? a.prefill_end_layer
          : a.prefill_start_layer + static_cast<int>(a.kv_data_ptrs.size()) / per_layer;
  layout.kv = Spans(a.kv_data_ptrs, a.kv_data_lens, a.kv_item_lens);
  layout.kv_layer_ids = a.kv_layer_ids;
  if (a.mla_compression_ratios.size() > kMaxBuffers ||
      std::any_of(a.mla_compression_ratios.begin(), a.mla_compression_ratios.end(),
                  [](int32_t r) { return r < 0; }))
    return InvalidArgumentError(fmt::format(
        "KVArgs: mla_compression_ratios must have at most {} entries, each >= 0", kMaxBuffers));
  layout.mla_compression_ratios = a.mla_compression_ratios;
  layout.num_draft_entries = a.num_draft_entries;  // CheckLayout bounds it
  layout.aux = Spans(a.aux_data_ptrs, a.aux_data_lens, a.aux_item_lens);
  layout.state = Spans(a.state_data_ptrs, a.state_data_lens, a.state_item_lens);
  KVB_RETURN_IF_ERROR(StateLayoutFromArgs(a, layout));
  KVB_RETURN_IF_ERROR(CheckLayout(layout).WithContext("KVArgs"));
  return layout;
}

Status StateLayoutFromArgs(const KVArgs& a, RankLayout& layout) {
  const size_t n = layout.state.size();
  if (!a.state_buffer_types.empty() && a.state_buffer_types.size() != n)
    return InvalidArgumentError(
        fmt::format("KVArgs: state_buffer_types has {} entries, state_data_ptrs {}",
                    a.state_buffer_types.size(), n));
  for (int32_t t : a.state_buffer_types)
    if (t < 0 || t >= static_cast<int32_t>(n))
      return InvalidArgumentError(
          fmt::format("KVArgs: state_buffer_types entry {} out of range [0, {})", t, n));
  layout.state_types = a.state_buffer_types;
  if (!a.state_layer_ids.empty() && a.state_layer_ids.size() != n)
    return InvalidArgumentError(fmt::format(
        "KVArgs: state_layer_ids has {} entries, state_data_ptrs {}", a.state_layer_ids.size(), n));
  layout.state_layer_ids = a.state_layer_ids;
  layout.state_type_names = a.state_type_names;  // CheckLayout judges them
  for (auto [name, size] : {std::pair{"state_slice_dims", a.state_slice_dims.size()},
                            {"state_slice_outer", a.state_slice_outer.size()},
                            {"state_slice_groups", a.state_slice_groups.size()}})
    if (size != 0 && size != n)
      return InvalidArgumentError(
          fmt::format("KVArgs: {} has {} entries, state_data_ptrs {}", name, size, n));
  if (a.state_slice_dims.empty()) {
    if (!a.state_slice_outer.empty() || !a.state_slice_groups.empty())
      return InvalidArgumentError(
          "KVArgs: state_slice_outer or state_slice_groups without state_slice_dims");
    return Status();
  }
  layout.state_sharding.resize(n);
  for (size_t b = 0; b < n; ++b) {
    StateSharding& s = layout.state_sharding[b];
    s.dim = a.state_slice_dims[b];
    s.outer = a.state_slice_outer.empty() ? 1 : a.state_slice_outer[b];
    if (!a.state_slice_groups.empty()) s.groups = a.state_slice_groups[b];
  }
  return Status();
}

}  // namespace kvbridge::internal
