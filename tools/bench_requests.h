// `kvbridge bench requests` and `kvbridge bench failures`: end-to-end figures
// over real `kvbridge worker` processes (see tools/cluster.h). They live in
// tools/ because the launcher does; tools/main.cc registers them under the
// `bench` subcommand that bench/bench.cc creates.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace kvbridge::tools {

// Adds `requests` to `bench` (the `kvbridge bench` subcommand).
void AddBenchRequestsCommand(CLI::App& bench, std::function<int()>& run);

}  // namespace kvbridge::tools
