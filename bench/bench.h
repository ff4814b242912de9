// `kvbridge bench ...` subcommands. Each benchmark registers itself here.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace kvbridge::bench {

// Adds `bench` and its subcommands to `app`. `run` is set to the action of the
// subcommand the user picked; it returns the process exit status.
void AddBenchCommands(CLI::App& app, std::function<int()>& run);

}  // namespace kvbridge::bench
