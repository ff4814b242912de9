// `kvbridge bench failures`: how long surviving ranks take to name a rank
// that was SIGKILLed (see tools/bench_failures.cc).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace kvbridge::tools {

// Adds `failures` to `bench` (the `kvbridge bench` subcommand).
void AddBenchFailuresCommand(CLI::App& bench, std::function<int()>& run);

}  // namespace kvbridge::tools
