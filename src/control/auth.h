// The deployment's shared secret: one token that every rank, the bootstrap
// server and the tools of one deployment hold, and that every write to the
// registry must show as "Authorization: Bearer <token>" (sglang's scheme,
// with sglang's variable accepted too, so mixed deployments share one).
//
// Where the token comes from, first match wins: an explicit value (an
// option, or the file named by --auth-token-file), $KVBRIDGE_AUTH_TOKEN,
// $SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN. Without one nothing starts:
// kvbridge never runs an open registry.
#pragma once

#include <string>
#include <string_view>

#include "kvbridge/status.h"

namespace kvbridge::internal {

inline constexpr const char* kAuthTokenEnv = "KVBRIDGE_AUTH_TOKEN";
inline constexpr const char* kSglangAuthTokenEnv = "SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN";
// Longest token accepted (a token is compared on every write).
inline constexpr size_t kMaxAuthTokenBytes = 1024;

// `explicit_token` when non-empty, else the environment (above).
// FailedPrecondition saying how to set one when there is none; InvalidArgument
// for a token with whitespace or control characters or over the limit.
// `who` ("bootstrap server", "prefill tp0") begins the message.
Result<std::string> ResolveAuthToken(std::string_view explicit_token, std::string_view who);

// The token in a file: its content without surrounding whitespace.
// InvalidArgument naming the file when it cannot be read or holds none.
Result<std::string> ReadAuthTokenFile(const std::string& path);

// The environment's token (above), or "" when none is set.
std::string AuthTokenFromEnvironment();

// A fresh random token (256 bits, hex), for a demo that starts its own
// deployment.
std::string NewAuthToken();

// Compares in time that depends only on the lengths, not on where the
// strings differ.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// Whether an Authorization header value carries `token`: Ok, or
// Unauthenticated saying what was wrong (missing, not Bearer, wrong token)
// and which variable holds the token.
Status CheckBearer(std::string_view authorization, std::string_view token);

// "Bearer <token>".
std::string BearerValue(std::string_view token);

// For a launcher that starts a whole deployment on this machine (the demo,
// the benchmarks, the tests): when neither variable holds a token, puts a
// new one in $KVBRIDGE_AUTH_TOKEN so that every process it starts inherits
// the same secret. Returns the token in force. Call it before starting
// threads that read the environment (setenv is not thread-safe).
std::string EnsureAuthTokenInEnvironment();

}  // namespace kvbridge::internal
