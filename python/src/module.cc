// kvbridge._kvbridge: the thin C++ layer under the Python package.
//
// Python sees handles over KVManager, KVSender, KVReceiver and BootstrapServer
// with the C++ semantics unchanged; the Pythonic surface (sglang's names,
// exceptions with failure records) lives in kvbridge/*.py. A non-OK Status
// leaves C++ as a StatusError and becomes, at the boundary, the exception that
// kvbridge/_errors.py's table names for its code: that table is the only
// place codes meet exception classes.
//
// GIL: calls that can block (bootstrap lookups, connects, posting writes,
// teardown) release it; poll(), failure(), quiesced() keep it, since they are
// one atomic load or one short lock and releasing would cost more than they do.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <span>
#include <string>

#include "control/json_fields.h"
#include "kvbridge/bootstrap.h"
#include "kvbridge/manager.h"
#include "kvbridge/receiver.h"
#include "kvbridge/sender.h"
#include "python/src/convert.h"
#include "tools/report_json.h"

namespace py = pybind11;

namespace kvbridge::python {
namespace {

using Indices = py::array_t<int32_t, py::array::c_style>;

std::span<const int32_t> Span(const std::optional<Indices>& a) {
  if (!a || a->size() == 0) return {};
  return {a->data(), static_cast<size_t>(a->size())};
}

// The manager lives as long as any sender or receiver made from it.
struct ManagerHandle {
  std::unique_ptr<KVManager> manager;
  KVManager& get() {
    if (!manager) throw StatusError(FailedPreconditionError("KVManager is closed"));
    return *manager;
  }
};

class PyManager {
 public:
  explicit PyManager(const py::dict& options) {
    ManagerOptions o = ManagerOptionsFromDict(options);
    py::gil_scoped_release release;
    auto m = KVManager::Create(o);
    if (!m.ok()) throw StatusError(m.status());
    handle_ = std::make_shared<ManagerHandle>();
    handle_->manager = std::move(m).value();
  }
  std::shared_ptr<ManagerHandle> handle() const { return handle_; }
  py::dict Self() { return RankToDict(handle_->get().self()); }
  std::string BootstrapAddr() { return handle_->get().bootstrap_addr(); }
  py::dict Stats() { return StatsToDict(handle_->get().Stats()); }
  void ReportFatal(const std::string& reason) { handle_->get().ReportFatal(reason); }
  std::vector<uint64_t> TakeChangedRooms() {
    auto rooms = handle_->get().TakeChangedRooms();
    if (!rooms.ok()) throw StatusError(rooms.status());
    return std::move(rooms).value();
  }
  // Drops this handle's reference; the C++ manager goes when the last room
  // made from it is closed.
  void Close() {
    std::shared_ptr<ManagerHandle> h = std::move(handle_);
    handle_ = std::make_shared<ManagerHandle>();
    if (h.use_count() == 1) h->manager.reset();
  }

 private:
  std::shared_ptr<ManagerHandle> handle_;
};

// Shared by sender and receiver: the last state and record survive close(),
// so poll() and failure() answer after the room was released.
template <typename Room>
class RoomHandle {
 public:
  KVPoll Poll() const { return room_ ? room_->Poll() : last_poll_; }
  std::optional<std::string> FailureJson() const {
    std::optional<FailureRecord> f = room_ ? room_->Failure() : last_failure_;
    if (!f) return std::nullopt;
    return internal::DumpJson(tools::FailureToJson(*f));
  }
  // Why the group failed (Room::GroupFailure); may wait, so without the GIL.
  std::string GroupFailureJson() const {
    std::optional<FailureRecord> f = last_failure_;
    if (room_) {
      py::gil_scoped_release release;
      f = room_->GroupFailure();
    }
    if (!f)
      throw StatusError(
          FailedPreconditionError("room " + std::to_string(room_id_) +
                                  " was cleared before it failed; it holds no failure record"));
    // A rank failure (room 0) or another rank's record answers for this
    // request: its room, message included, is this one.
    f->room = room_id_;
    return internal::DumpJson(tools::FailureToJson(*f));
  }
  uint64_t room() const { return room_id_; }
  bool closed() const { return room_ == nullptr; }
  void Close() {
    if (!room_) return;
    last_poll_ = room_->Poll();
    last_failure_ = room_->Failure();
    room_.reset();  // releases the room (aborts it first when unfinished)
    manager_.reset();
  }

 protected:
  Room& live() {
    if (!room_)
      throw StatusError(FailedPreconditionError("room " + std::to_string(room_id_) +
                                                " was cleared; make a new sender/receiver"));
    return *room_;
  }
  std::shared_ptr<ManagerHandle> manager_;
  std::unique_ptr<Room> room_;
  uint64_t room_id_ = 0;
  KVPoll last_poll_ = KVPoll::kFailed;
  std::optional<FailureRecord> last_failure_;
};

class PySender : public RoomHandle<KVSender> {
 public:
  PySender(const PyManager& m, uint64_t room) {
    manager_ = m.handle();
    room_id_ = room;
    auto s = KVSender::Create(manager_->get(), room);
    if (!s.ok()) throw StatusError(s.status());
    room_ = std::move(s).value();
  }
  void Init(int64_t num_pages, int64_t aux_index) { Check(live().Init(num_pages, aux_index)); }
  void Send(const Indices& pages, const std::optional<Indices>& state) {
    KVSender& s = live();
    std::span<const int32_t> p = Span(pages), st = Span(state);
    Status result;
    {
      py::gil_scoped_release release;
      result = s.Send(p, st);
    }
    Check(result);
  }
  void Abort() { live().Abort(); }
  void Reject(const std::string& reason) { live().Reject(reason); }
  int64_t DecodePrefixPages() const { return room_ ? room_->DecodePrefixPages() : -1; }
  // (alloc_seconds, transfer_seconds), each None until known; kept past close().
  std::pair<std::optional<double>, std::optional<double>> Timing() const {
    TransferTiming t = room_ ? room_->Timing() : last_timing_;
    return {t.alloc_seconds, t.transfer_seconds};
  }
  void Close() {
    if (room_) last_timing_ = room_->Timing();
    RoomHandle<KVSender>::Close();
  }

 private:
  TransferTiming last_timing_;
};

class PyReceiver : public RoomHandle<KVReceiver> {
 public:
  PyReceiver(const PyManager& m, uint64_t room) {
    manager_ = m.handle();
    room_id_ = room;
    auto r = KVReceiver::Create(manager_->get(), room);
    if (!r.ok()) throw StatusError(r.status());
    room_ = std::move(r).value();
  }
  void Init(int prefill_dp_rank) { Check(live().Init(prefill_dp_rank)); }
  void SendMetadata(const Indices& pages, int64_t aux_index, const std::optional<Indices>& state,
                    int64_t decode_prefix_len) {
    KVReceiver& r = live();
    std::span<const int32_t> p = Span(pages), st = Span(state);
    Status result;
    {
      py::gil_scoped_release release;
      result = r.SendMetadata(p, aux_index, st, decode_prefix_len);
    }
    Check(result);
  }
  void Abort() { live().Abort(); }
  void Reject(const std::string& reason) { live().Reject(reason); }
  bool Quiesced() const { return room_ ? room_->Quiesced() : true; }
  std::string FailAsGroupJson() {
    if (!room_) return GroupFailureJson();
    KVReceiver& r = live();
    FailureRecord f;
    {
      py::gil_scoped_release release;
      f = r.FailAsGroup();
    }
    f.room = room_id_;
    return internal::DumpJson(tools::FailureToJson(f));
  }
  KVPoll PollSettled() const { return room_ ? room_->PollSettled() : Poll(); }
  bool WaitQuiesced(double timeout_s) const {
    if (!room_) return true;
    // NaN and negatives wait not at all; anything past an hour is an hour.
    const double s = std::min(std::max(0.0, timeout_s), 3600.0);
    auto ms = std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
    return room_->WaitQuiesced(ms);
  }
  uint64_t Generation() { return live().generation(); }
};

class PyBootstrapServer {
 public:
  PyBootstrapServer(const std::string& host, int port, int unresponsive_after_ms,
                    int dead_after_ms) {
    BootstrapServerOptions o;
    o.host = host;
    o.port = port;
    if (unresponsive_after_ms > 0)
      o.unresponsive_after = std::chrono::milliseconds(unresponsive_after_ms);
    if (dead_after_ms > 0) o.dead_after = std::chrono::milliseconds(dead_after_ms);
    py::gil_scoped_release release;
    auto s = BootstrapServer::Start(o);
    if (!s.ok()) throw StatusError(s.status());
    server_ = std::move(s).value();
  }
  int port() const { return server_ ? server_->port() : 0; }
  std::string address() const { return server_ ? server_->address() : ""; }
  void Stop() {
    if (server_) server_->Stop();
  }

 private:
  std::unique_ptr<BootstrapServer> server_;
};

}  // namespace
}  // namespace kvbridge::python

PYBIND11_MODULE(_kvbridge, m) {
  using namespace kvbridge;
  using namespace kvbridge::python;
  m.doc() = "kvbridge C++ core; use the kvbridge package, not this module.";
  RegisterStatusTranslator();
  DefineEnumHelpers(m);
  DefineRegistry(m);

  using Release = py::call_guard<py::gil_scoped_release>;
  py::class_<PyManager>(m, "Manager")
      .def(py::init<const py::dict&>(), py::arg("options"))
      .def("self_rank", &PyManager::Self)
      .def("bootstrap_addr", &PyManager::BootstrapAddr)
      .def("stats", &PyManager::Stats)
      .def("take_changed_rooms", &PyManager::TakeChangedRooms)
      .def("report_fatal", &PyManager::ReportFatal, py::arg("reason"), Release())
      .def("close", &PyManager::Close, Release());

  py::class_<PySender>(m, "Sender")
      .def(py::init<const PyManager&, uint64_t>(), py::arg("manager"), py::arg("room"), Release())
      .def_property_readonly("room", &PySender::room)
      .def_property_readonly("closed", &PySender::closed)
      .def("init", &PySender::Init, py::arg("num_pages"), py::arg("aux_index"), Release())
      .def("send", &PySender::Send, py::arg("pages"), py::arg("state") = py::none())
      .def("poll", [](const PySender& s) { return PollObject(s.Poll()); })
      .def("failure_json", &PySender::FailureJson)
      .def("group_failure_json", &PySender::GroupFailureJson)
      .def("decode_prefix_pages", &PySender::DecodePrefixPages)
      .def("timing", &PySender::Timing)
      .def("abort", &PySender::Abort, Release())
      .def("reject", &PySender::Reject, py::arg("reason"), Release())
      .def("close", &PySender::Close, Release());

  py::class_<PyReceiver>(m, "Receiver")
      .def(py::init<const PyManager&, uint64_t>(), py::arg("manager"), py::arg("room"), Release())
      .def_property_readonly("room", &PyReceiver::room)
      .def_property_readonly("closed", &PyReceiver::closed)
      .def_property_readonly("generation", &PyReceiver::Generation)
      .def("init", &PyReceiver::Init, py::arg("prefill_dp_rank") = 0, Release())
      .def("send_metadata", &PyReceiver::SendMetadata, py::arg("pages"), py::arg("aux_index"),
           py::arg("state") = py::none(), py::arg("decode_prefix_len") = 0)
      .def("poll", [](const PyReceiver& r) { return PollObject(r.Poll()); })
      .def("failure_json", &PyReceiver::FailureJson)
      .def("group_failure_json", &PyReceiver::GroupFailureJson)
      .def("quiesced", &PyReceiver::Quiesced)
      .def("fail_as_group_json", &PyReceiver::FailAsGroupJson)
      .def("poll_settled", [](const PyReceiver& r) { return PollObject(r.PollSettled()); })
      .def("wait_quiesced", &PyReceiver::WaitQuiesced, py::arg("timeout_s"), Release())
      .def("abort", &PyReceiver::Abort, Release())
      .def("reject", &PyReceiver::Reject, py::arg("reason"), Release())
      .def("close", &PyReceiver::Close, Release());

  py::class_<PyBootstrapServer>(m, "BootstrapServer")
      .def(py::init<const std::string&, int, int, int>(), py::arg("host"), py::arg("port"),
           py::arg("unresponsive_after_ms") = 0, py::arg("dead_after_ms") = 0)
      .def_property_readonly("port", &PyBootstrapServer::port)
      .def_property_readonly("address", &PyBootstrapServer::address)
      .def("stop", &PyBootstrapServer::Stop, Release());
}
