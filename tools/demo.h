// `kvbridge demo`: a bootstrap server, a prefill instance and a decode
// instance as real processes on this host, a stream of varied-length
// requests through them, every destination page verified, live progress and
// a summary (or one JSON object with --json). `--fault KIND[@WHEN]` injects
// a fault mid-run and shows what every surviving rank reported and how long
// detection took. Exit status 0 when the run behaved as expected.
//
// Also registers the hidden `demo-bootstrap` command: a standalone bootstrap
// server on a free port that prints "READY {json}" and exits when stdin
// closes (the demo's bootstrap process, so that killing it is a fault of its
// own).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvbridge::tools {

void AddDemoCommands(CLI::App& app, std::function<int()>& run);

// --fault KIND[@WHEN]: WHEN is a count of finished requests ("@20") or a
// time since the start of traffic ("@2s", "@500ms").
struct FaultSpec {
  std::string kind;  // "" = no fault
  int64_t after_requests = -1;
  int64_t after_ms = -1;
};
// InvalidArgument-style message in *error when the spec is malformed.
bool ParseFaultSpec(const std::string& text, FaultSpec* spec, std::string* error);

}  // namespace kvbridge::tools
