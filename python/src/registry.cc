// _kvbridge.prefill_info(address, timeout_s): a prefill instance's shape as
// its bootstrap registry tells it (sglang's PrefillServerInfo), plus the
// model's kv head count from a registered rank's layout, so that a decode
// rank whose KVArgs leave kv_head_num unset can take it from prefill. The
// HTTP is C++ (BootstrapClient); Python does none.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "connector/layout_json.h"
#include "control/auth.h"
#include "control/bootstrap_client.h"
#include "python/src/convert.h"

namespace py = pybind11;

namespace kvbridge::python {

namespace {

// Every rank of a known shape registered (no rank at all is not complete).
bool Complete(const internal::ParallelInfo& info) {
  return info.ranks_expected > 0 && info.complete();
}

py::dict PrefillInfo(const std::string& address, double timeout_s) {
  using internal::BootstrapClient;
  if (!(timeout_s > 0) || timeout_s > 3600)
    throw StatusError(InvalidArgumentError("timeout_s must be in (0, 3600]"));
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  Result<internal::ParallelInfo> info = UnavailableError("not asked");
  Result<internal::RankRecord> first = UnavailableError("not asked");
  {
    py::gil_scoped_release release;
    // Reads need no secret; the environment's goes along all the same.
    auto client = BootstrapClient::Create(address, timeout, internal::AuthTokenFromEnvironment());
    if (!client.ok()) throw StatusError(client.status());
    info = (*client)->GetParallelInfo();
    if (info.ok() && Complete(*info)) first = (*client)->GetRank(0, 0, 0, 0);
  }
  if (!info.ok()) throw StatusError(info.status().WithContext(address));
  py::dict d;
  d["attn_tp_size"] = info->attn_tp_size;
  d["attn_cp_size"] = info->attn_cp_size;
  d["dp_size"] = info->attn_dp_size;
  d["pp_size"] = info->pp_size;
  d["page_size"] = info->page_size;
  d["kv_cache_dtype"] = info->kv_cache_dtype;
  d["follow_bootstrap_room"] = info->follow_bootstrap_room;
  d["prefill_http_port"] =
      info->prefill_http_port != 0 ? py::object(py::int_(info->prefill_http_port)) : py::none();
  d["ranks_registered"] = info->ranks_registered;
  d["ranks_expected"] = info->ranks_expected;
  d["complete"] = Complete(*info);
  d["total_kv_heads"] = py::none();
  d["is_mla"] = py::none();
  d["mla_compression_ratios"] = py::list();
  if (first.ok()) {
    Result<internal::RankLayout> layout = internal::LayoutFromJson(first->layout);
    if (layout.ok()) {
      d["total_kv_heads"] = layout->total_kv_heads;
      d["is_mla"] = layout->is_mla;
      d["mla_compression_ratios"] = layout->mla_compression_ratios;
    }
  }
  return d;
}

std::chrono::milliseconds Timeout(double timeout_s) {
  if (!(timeout_s > 0) || timeout_s > 3600)
    throw StatusError(InvalidArgumentError("timeout_s must be in (0, 3600]"));
  return std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
}

std::unique_ptr<internal::BootstrapClient> Client(const std::string& address, double timeout_s) {
  auto client = internal::BootstrapClient::Create(address, Timeout(timeout_s),
                                                  internal::AuthTokenFromEnvironment());
  if (!client.ok()) throw StatusError(client.status());
  return std::move(client).value();
}

// sglang's prefill sender, when requests do not follow the room: which dp
// rank took `room` (POST /register_dp_rank, with the deployment's secret).
void RegisterDpRank(const std::string& address, uint64_t room, int dp_rank, double timeout_s) {
  auto client = Client(address, timeout_s);
  Status s = Status::Ok();
  {
    py::gil_scoped_release release;
    s = client->RegisterDpRank(room, dp_rank);
  }
  if (!s.ok()) throw StatusError(s.WithContext(address));
}

// sglang's CommonKVReceiver.query_prefill_dp_ranks: {str(room): dp_rank} for
// the rooms the registry knows (POST /query_dp_ranks).
py::dict QueryDpRanks(const std::string& address, const std::vector<uint64_t>& rooms,
                      double timeout_s) {
  auto client = Client(address, timeout_s);
  Result<std::map<uint64_t, int>> known = UnavailableError("not asked");
  {
    py::gil_scoped_release release;
    known = client->QueryDpRanks(rooms);
  }
  if (!known.ok()) throw StatusError(known.status().WithContext(address));
  py::dict d;
  for (const auto& [room, rank] : *known) d[py::str(std::to_string(room))] = rank;
  return d;
}

}  // namespace

void DefineRegistry(py::module_& m) {
  m.def("prefill_info", &PrefillInfo, py::arg("address"), py::arg("timeout_s") = 5.0);
  m.def("register_dp_rank", &RegisterDpRank, py::arg("address"), py::arg("room"),
        py::arg("dp_rank"), py::arg("timeout_s") = 5.0);
  m.def("query_dp_ranks", &QueryDpRanks, py::arg("address"), py::arg("rooms"),
        py::arg("timeout_s") = 5.0);
}

}  // namespace kvbridge::python
