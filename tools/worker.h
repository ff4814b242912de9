// `kvbridge worker`: one rank of a prefill or decode instance running a
// deterministic stream of requests the way a scheduler would (poll every
// step, chunked prefill, page reuse only after success or quiescence), then
// printing one JSON report. The demo and the multi-process tests start these.
//
// Protocol on stdout: "READY {json}" once the manager is up, "REPORT {json}"
// at the end. The process then waits for stdin to close before it exits, so
// a finished rank never looks like a dead one to its peers.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace kvbridge::tools {

void AddWorkerCommand(CLI::App& app, std::function<int()>& run);

}  // namespace kvbridge::tools
