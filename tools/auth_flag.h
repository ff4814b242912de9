// --auth-token-file, for every command that runs or talks to a registry.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <string_view>

#include "kvbridge/status.h"

namespace kvbridge::tools {

void AddAuthTokenFileOption(CLI::App* cmd, std::string* path);

// The token in the file at `path` when given, else the environment's
// (control/auth.h); the error names `command` and says how to set one.
Result<std::string> CommandAuthToken(const std::string& path, std::string_view command);

}  // namespace kvbridge::tools
