#include "python/src/convert.h"

#include <pybind11/stl.h>

#include <chrono>
#include <set>
#include <vector>

#include "common/text.h"
#include "kvbridge/errors.h"
#include "tools/report_json.h"

namespace py = pybind11;

namespace kvbridge::python {
namespace {

// Leaked on purpose: interpreter teardown must not run their destructors.
PyObject* g_poll_members[5] = {nullptr, nullptr, nullptr, nullptr, nullptr};

template <typename T>
T Field(const py::dict& d, const char* key, T fallback, std::set<std::string>* seen) {
  seen->insert(key);
  if (!d.contains(key) || d[key].is_none()) return fallback;
  try {
    return d[key].cast<T>();
  } catch (const py::cast_error&) {
    throw StatusError(InvalidArgumentError(std::string(key) + ": cannot use " +
                                           py::repr(d[key]).cast<std::string>()));
  }
}

void RejectUnknown(const py::dict& d, const std::set<std::string>& seen, const char* what) {
  for (auto item : d) {
    std::string key = py::str(item.first);
    if (!seen.count(key))
      throw StatusError(InvalidArgumentError(std::string(what) + ": unknown option '" + key + "'"));
  }
}

std::chrono::milliseconds Ms(const py::dict& d, const char* key, std::chrono::milliseconds fallback,
                             std::set<std::string>* seen) {
  return std::chrono::milliseconds(Field<int64_t>(d, key, fallback.count(), seen));
}

KVArgs ArgsFromDict(const py::dict& d) {
  std::set<std::string> seen;
  KVArgs a;
  using U64s = std::vector<uint64_t>;
  a.engine_rank = Field<int>(d, "engine_rank", a.engine_rank, &seen);
  a.kv_data_ptrs = Field<U64s>(d, "kv_data_ptrs", {}, &seen);
  a.kv_data_lens = Field<U64s>(d, "kv_data_lens", {}, &seen);
  a.kv_item_lens = Field<U64s>(d, "kv_item_lens", {}, &seen);
  a.aux_data_ptrs = Field<U64s>(d, "aux_data_ptrs", {}, &seen);
  a.aux_data_lens = Field<U64s>(d, "aux_data_lens", {}, &seen);
  a.aux_item_lens = Field<U64s>(d, "aux_item_lens", {}, &seen);
  a.state_data_ptrs = Field<U64s>(d, "state_data_ptrs", {}, &seen);
  a.state_data_lens = Field<U64s>(d, "state_data_lens", {}, &seen);
  a.state_item_lens = Field<U64s>(d, "state_item_lens", {}, &seen);
  a.state_buffer_types = Field<std::vector<int32_t>>(d, "state_buffer_types", {}, &seen);
  a.kv_layer_ids = Field<std::vector<int32_t>>(d, "kv_layer_ids", {}, &seen);
  a.mla_compression_ratios = Field<std::vector<int32_t>>(d, "mla_compression_ratios", {}, &seen);
  a.state_layer_ids = Field<std::vector<int32_t>>(d, "state_layer_ids", {}, &seen);
  a.state_type_names = Field<std::vector<std::string>>(d, "state_type_names", {}, &seen);
  using U32s = std::vector<uint32_t>;
  a.state_slice_dims = Field<U32s>(d, "state_slice_dims", {}, &seen);
  a.state_slice_outer = Field<U32s>(d, "state_slice_outer", {}, &seen);
  a.state_slice_groups = Field<std::vector<U32s>>(d, "state_slice_groups", {}, &seen);
  a.page_size = Field<int>(d, "page_size", a.page_size, &seen);
  a.kv_head_num = Field<int>(d, "kv_head_num", a.kv_head_num, &seen);
  a.total_kv_head_num = Field<int>(d, "total_kv_head_num", a.total_kv_head_num, &seen);
  a.prefill_start_layer = Field<int>(d, "prefill_start_layer", a.prefill_start_layer, &seen);
  a.prefill_end_layer = Field<int>(d, "prefill_end_layer", a.prefill_end_layer, &seen);
  a.num_draft_entries = Field<int>(d, "num_draft_entries", a.num_draft_entries, &seen);
  a.dtype = Field<std::string>(d, "dtype", a.dtype, &seen);
  std::string kind = Field<std::string>(d, "memory_kind", "dram", &seen);
  if (kind != "dram" && kind != "vram")
    throw StatusError(InvalidArgumentError("memory_kind '" + kind + "' is not dram or vram"));
  a.memory_kind = kind == "vram" ? MemoryKind::kVram : MemoryKind::kDram;
  RejectUnknown(d, seen, "KVArgs");
  return a;
}

ParallelLayout ParallelFromDict(const py::dict& d) {
  std::set<std::string> seen;
  ParallelLayout p;
  p.tp_size = Field<int>(d, "tp_size", p.tp_size, &seen);
  p.tp_rank = Field<int>(d, "tp_rank", p.tp_rank, &seen);
  p.dp_size = Field<int>(d, "dp_size", p.dp_size, &seen);
  p.dp_rank = Field<int>(d, "dp_rank", p.dp_rank, &seen);
  p.pp_size = Field<int>(d, "pp_size", p.pp_size, &seen);
  p.pp_rank = Field<int>(d, "pp_rank", p.pp_rank, &seen);
  p.cp_size = Field<int>(d, "cp_size", p.cp_size, &seen);
  p.cp_rank = Field<int>(d, "cp_rank", p.cp_rank, &seen);
  p.all_cp_ranks = Field<bool>(d, "all_cp_ranks", p.all_cp_ranks, &seen);
  p.dcp_size = Field<int>(d, "dcp_size", p.dcp_size, &seen);
  p.dcp_rank = Field<int>(d, "dcp_rank", p.dcp_rank, &seen);
  RejectUnknown(d, seen, "ParallelLayout");
  return p;
}

}  // namespace

void RegisterStatusTranslator() {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      const Status& s = e.status();
      // A message may quote a peer's bytes; a str must be UTF-8 (else the
      // KVTransferError became an empty RuntimeError: hostile-input audit).
      const std::string message = internal::ValidUtf8(s.message());
      try {
        py::object exc = py::module_::import("kvbridge._errors")
                             .attr("from_status")(static_cast<int>(s.code()), message);
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
      } catch (py::error_already_set& nested) {
        // The package is not importable (module used alone): keep the text.
        PyErr_SetString(PyExc_RuntimeError, internal::ValidUtf8(s.ToString()).c_str());
      }
    }
  });
}

py::object PollObject(KVPoll p) {
  PyObject* member = g_poll_members[static_cast<int>(p)];
  if (member == nullptr) return py::int_(static_cast<int>(p));
  return py::reinterpret_borrow<py::object>(member);
}

void DefineEnumHelpers(py::module_& m) {
  m.def("status_code_name",
        [](int code) { return std::string(StatusCodeName(static_cast<StatusCode>(code))); });
  m.def("failure_causes", [] {
    std::vector<std::pair<std::string, int>> out;
    for (FailureCause c : AllFailureCauses())
      out.emplace_back(FailureCauseName(c), static_cast<int>(FailureCauseCode(c)));
    return out;
  });
  m.def("failure_hint", [](const std::string& cause) {
    FailureCause c;
    if (!ParseFailureCause(cause, &c)) throw StatusError(InvalidArgumentError("cause " + cause));
    return std::string(FailureHint(c));
  });
  m.def("kv_poll_name", [](int p) { return std::string(KVPollName(static_cast<KVPoll>(p))); });
  m.def("_set_poll_enum", [](const py::sequence& members) {
    if (members.size() != 5) throw StatusError(InvalidArgumentError("need 5 KVPoll members"));
    for (size_t i = 0; i < 5; ++i) {
      PyObject* o = members[i].ptr();
      Py_INCREF(o);
      g_poll_members[i] = o;
    }
  });
  // Raises what a C++ call failing with (code, message) raises: the tests use
  // it to check the translation of every code.
  m.def("_raise_status", [](int code, const std::string& message) {
    Check(Status(static_cast<StatusCode>(code), message));
  });
}

ManagerOptions ManagerOptionsFromDict(const py::dict& d) {
  std::set<std::string> seen;
  ManagerOptions o;
  std::string role = Field<std::string>(d, "role", "prefill", &seen);
  if (role != "prefill" && role != "decode")
    throw StatusError(InvalidArgumentError("mode '" + role + "' is not prefill or decode"));
  o.role = role == "prefill" ? Role::kPrefill : Role::kDecode;
  o.args = ArgsFromDict(Field<py::dict>(d, "args", py::dict(), &seen));
  o.parallel = ParallelFromDict(Field<py::dict>(d, "parallel", py::dict(), &seen));
  o.is_mla = Field<bool>(d, "is_mla", o.is_mla, &seen);
  o.instance_id = Field<std::string>(d, "instance_id", o.instance_id, &seen);
  o.bootstrap_addr = Field<std::string>(d, "bootstrap_addr", o.bootstrap_addr, &seen);
  o.start_bootstrap_server =
      Field<bool>(d, "start_bootstrap_server", o.start_bootstrap_server, &seen);
  o.registry = Field<std::string>(d, "registry", o.registry, &seen);
  o.advertise_host = Field<std::string>(d, "advertise_host", o.advertise_host, &seen);
  o.follow_bootstrap_room = Field<bool>(d, "follow_bootstrap_room", o.follow_bootstrap_room, &seen);
  o.prefill_http_port = Field<int>(d, "prefill_http_port", o.prefill_http_port, &seen);
  o.ucx_tls = Field<std::string>(d, "ucx_tls", o.ucx_tls, &seen);
  std::string path = Field<std::string>(d, "same_host_path", "auto", &seen);
  if (path != "auto" && path != "ucx")
    throw StatusError(InvalidArgumentError("same_host_path '" + path + "' is not auto or ucx"));
  o.same_host_path = path == "ucx" ? SameHostPath::kUcx : SameHostPath::kAuto;
  o.heartbeat_interval = Ms(d, "heartbeat_interval_ms", o.heartbeat_interval, &seen);
  o.heartbeat_misses = Field<int>(d, "heartbeat_misses", o.heartbeat_misses, &seen);
  o.bootstrap_timeout = Ms(d, "bootstrap_timeout_ms", o.bootstrap_timeout, &seen);
  o.waiting_timeout = Ms(d, "waiting_timeout_ms", o.waiting_timeout, &seen);
  o.transfer_timeout = Ms(d, "transfer_timeout_ms", o.transfer_timeout, &seen);
  o.metrics_port = Field<int>(d, "metrics_port", o.metrics_port, &seen);
  o.list_room_changes = Field<bool>(d, "list_room_changes", o.list_room_changes, &seen);
  RejectUnknown(d, seen, "KVManager config");
  return o;
}

py::dict RankToDict(const RankId& r) {
  py::dict d;
  d["role"] = std::string(RoleName(r.role));
  d["dp"] = r.dp;
  d["tp"] = r.tp;
  d["pp"] = r.pp;
  d["cp"] = r.cp;
  d["host"] = r.host;
  d["pid"] = r.pid;
  d["incarnation"] = r.incarnation;
  d["instance"] = r.instance;
  d["name"] = r.ShortName();
  return d;
}

py::dict StatsToDict(const ManagerStats& s) {
  return py::module_::import("json").attr("loads")(tools::StatsToJson(s).dump());
}

}  // namespace kvbridge::python
