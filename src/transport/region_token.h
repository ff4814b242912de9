// Write capabilities: unguessable tokens a region owner hands to the peers it
// exports a region to, and the peer must show on every write.
//
// A token is 128 bits from the kernel CSPRNG (getrandom(2), /dev/urandom as
// fall-back); it is compared in constant time so that the time a refusal
// takes does not tell a guesser how many leading bytes were right.
//
// Thread safety: pure functions, callable from any thread.
#pragma once

#include <array>
#include <cstdint>

#include "kvbridge/status.h"

namespace kvbridge::internal {

struct RegionToken {
  std::array<uint8_t, 16> bytes{};
};

// Fills `out` with `length` random bytes from the kernel CSPRNG. Errors:
// Internal when neither getrandom nor /dev/urandom answers (never silently
// weaker randomness).
Status SecureRandomBytes(void* out, size_t length);
// A fresh token; Internal as above.
Result<RegionToken> NewRegionToken();
// A random non-zero 64-bit value (connection ids); Internal as above.
Result<uint64_t> SecureRandomU64();
// Constant-time equality.
bool TokensEqual(const RegionToken& a, const RegionToken& b);
// All bytes zero (a token never drawn).
bool IsZeroToken(const RegionToken& t);

}  // namespace kvbridge::internal
