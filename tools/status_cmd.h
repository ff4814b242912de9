// `kvbridge status --bootstrap HOST:PORT [--watch [--interval S]] [--json]`:
// what a bootstrap server knows. A table of registered ranks (role, dp/tp/pp,
// host, pid, address, last heartbeat age, alive/unresponsive/dead) and the
// most recent failure records (their messages); --json prints one object
// instead (one per line with --watch).
//
// Exit status: 0 when the server answered; 1 when it could not be reached or
// answered nonsense ("bootstrap server HOST:PORT unreachable: ..." on
// stderr); 2 for a malformed address. --watch keeps refreshing through
// errors until SIGINT/SIGTERM, then exits 0.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace kvbridge::tools {

void AddStatusCommand(CLI::App& app, std::function<int()>& run);

}  // namespace kvbridge::tools
