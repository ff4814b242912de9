// `kvbridge bench scale`: many rooms in flight at once (issue 14). Small
// requests through real prefill and decode worker processes (tools/cluster.h)
// at a small and a large number of rooms in flight, side by side:
// throughput, latency up to the slowest request against the deadline, and
// resident memory per room in flight above the page pools.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace kvbridge::tools {

// Adds `scale` to `bench` (the `kvbridge bench` subcommand).
void AddBenchScaleCommand(CLI::App& bench, std::function<int()>& run);

}  // namespace kvbridge::tools
