#include "control/auth.h"

#include <sys/random.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace kvbridge::internal {
namespace {

std::string HowToSet() {
  return std::string("set ") + kAuthTokenEnv + " (or " + kSglangAuthTokenEnv +
         ") to the same secret on every rank and on the bootstrap server, or pass "
         "--auth-token-file";
}

Status CheckToken(std::string_view token, std::string_view where) {
  if (token.size() > kMaxAuthTokenBytes) {
    return InvalidArgumentError("the auth token from " + std::string(where) + " is " +
                                std::to_string(token.size()) + " bytes, more than the limit of " +
                                std::to_string(kMaxAuthTokenBytes));
  }
  for (char c : token) {
    if (std::isspace(static_cast<unsigned char>(c)) ||
        std::iscntrl(static_cast<unsigned char>(c))) {
      return InvalidArgumentError("the auth token from " + std::string(where) +
                                  " contains whitespace or control characters");
    }
  }
  return Status::Ok();
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

Result<std::string> ResolveAuthToken(std::string_view explicit_token, std::string_view who) {
  if (!explicit_token.empty()) {
    KVB_RETURN_IF_ERROR(CheckToken(explicit_token, "the options"));
    return std::string(explicit_token);
  }
  for (const char* name : {kAuthTokenEnv, kSglangAuthTokenEnv}) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    KVB_RETURN_IF_ERROR(CheckToken(value, std::string("$") + name));
    return std::string(value);
  }
  return FailedPreconditionError(
      std::string(who) +
      ": no auth token, and kvbridge never runs an open registry: " + HowToSet());
}

Result<std::string> ReadAuthTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return InvalidArgumentError("cannot read the auth token file '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  const std::string content = text.str();
  std::string_view token = Trim(content);
  if (token.empty()) return InvalidArgumentError("the auth token file '" + path + "' is empty");
  KVB_RETURN_IF_ERROR(CheckToken(token, "'" + path + "'"));
  return std::string(token);
}

std::string AuthTokenFromEnvironment() {
  Result<std::string> token = ResolveAuthToken("", "");
  return token.ok() ? std::move(token).value() : std::string();
}

std::string NewAuthToken() {
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

Status CheckBearer(std::string_view authorization, std::string_view token) {
  // Fail closed: without a secret of our own nobody is admitted.
  if (token.empty()) return UnauthenticatedError("no auth token is configured here; " + HowToSet());
  if (authorization.empty()) {
    return UnauthenticatedError("this route needs 'Authorization: Bearer <token>'; " + HowToSet());
  }
  constexpr std::string_view kScheme = "bearer ";
  std::string scheme(authorization.substr(0, kScheme.size()));
  for (char& c : scheme) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (scheme != kScheme) {
    return UnauthenticatedError("the Authorization header is not 'Bearer <token>'; " + HowToSet());
  }
  if (!ConstantTimeEquals(Trim(authorization.substr(kScheme.size())), token)) {
    return UnauthenticatedError("wrong auth token; " + HowToSet());
  }
  return Status::Ok();
}

std::string BearerValue(std::string_view token) { return "Bearer " + std::string(token); }

std::string EnsureAuthTokenInEnvironment() {
  Result<std::string> token = ResolveAuthToken("", "launcher");
  if (token.ok()) return std::move(token).value();
  std::string fresh = NewAuthToken();
  setenv(kAuthTokenEnv, fresh.c_str(), /*overwrite=*/1);
  return fresh;
}

}  // namespace kvbridge::internal
