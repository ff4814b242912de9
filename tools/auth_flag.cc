#include "tools/auth_flag.h"

#include "control/auth.h"

namespace kvbridge::tools {

void AddAuthTokenFileOption(CLI::App* cmd, std::string* path) {
  cmd->add_option("--auth-token-file", *path,
                  "File holding the deployment's shared secret (default: $KVBRIDGE_AUTH_TOKEN, "
                  "else $SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN)");
}

Result<std::string> CommandAuthToken(const std::string& path, std::string_view command) {
  if (!path.empty()) return internal::ReadAuthTokenFile(path);
  return internal::ResolveAuthToken("", command);
}

}  // namespace kvbridge::tools
