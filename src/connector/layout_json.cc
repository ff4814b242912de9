#include "connector/layout_json.h"

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

}  // namespace

nlohmann::json LayoutToJson(const RankLayout& l) {
  return {{"is_mla", l.is_mla},        {"page_size", l.page_size},
          {"dtype", l.dtype},          {"tp_size", l.tp_size},
          {"tp_rank", l.tp_rank},      {"total_kv_heads", l.total_kv_heads},
          {"kv_heads", l.kv_heads},    {"start_layer", l.start_layer},
          {"end_layer", l.end_layer},  {"kv", SpansToJson(l.kv)},
          {"aux", SpansToJson(l.aux)}, {"state", SpansToJson(l.state)}};
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
  return l;
}

}  // namespace kvbridge::internal
