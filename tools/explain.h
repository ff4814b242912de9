// `kvbridge explain [CAUSE]`: the error catalog (docs/errors.md, compiled
// in). Without an argument, every cause with its one-line meaning; with one,
// that cause's entry. An unknown cause is a usage error (exit 2) that lists
// the valid names.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace kvbridge::tools {

void AddExplainCommand(CLI::App& app, std::function<int()>& run);

}  // namespace kvbridge::tools
