// Conversions between the C++ API and Python values for kvbridge._kvbridge.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <string>

#include "kvbridge/kv_poll.h"
#include "kvbridge/manager.h"
#include "kvbridge/status.h"

namespace kvbridge::python {

// A non-OK Status on its way out of C++; RegisterStatusTranslator turns it
// into the exception kvbridge._errors maps its code to.
class StatusError : public std::exception {
 public:
  explicit StatusError(Status status) : status_(std::move(status)) {}
  const Status& status() const { return status_; }
  const char* what() const noexcept override { return status_.message().c_str(); }

 private:
  Status status_;
};

inline void Check(const Status& s) {
  if (!s.ok()) throw StatusError(s);
}

void RegisterStatusTranslator();

// Module-level helpers: code and cause names, the poll-enum hook, the
// status-raising test hook.
void DefineEnumHelpers(pybind11::module_& m);
// _kvbridge.prefill_info (registry.cc).
void DefineRegistry(pybind11::module_& m);

// The kvbridge.KVPoll member for `p` once the package registered the enum
// (plain int before).
pybind11::object PollObject(KVPoll p);

// Options from the dict kvbridge/_api.py builds. Unknown keys and wrong types
// are InvalidArgument naming the key.
ManagerOptions ManagerOptionsFromDict(const pybind11::dict& d);

pybind11::dict RankToDict(const RankId& r);
pybind11::dict StatsToDict(const ManagerStats& s);

}  // namespace kvbridge::python
