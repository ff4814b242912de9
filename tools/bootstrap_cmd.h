// `kvbridge bootstrap --host H --port P`: runs the bootstrap server (the
// registry ranks register with and `kvbridge status` reads) standalone.
//
// Prints "kvbridge bootstrap server listening on HOST:PORT" on stdout once it
// accepts requests (with --port 0, the port it picked), serves until SIGINT or
// SIGTERM, then stops cleanly and exits 0. Exit 1 when it cannot listen.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace kvbridge::tools {

void AddBootstrapCommand(CLI::App& app, std::function<int()>& run);

}  // namespace kvbridge::tools
