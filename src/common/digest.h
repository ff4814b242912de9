// SHA-256 and HMAC-SHA256 (OpenSSL), for the handshake (connector/peer_auth)
// and the sealed etcd values (control/etcd_seal). Pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvbridge::internal {

using Digest = std::array<uint8_t, 32>;  // SHA-256, HMAC-SHA256

Digest Sha256(std::string_view data);
Digest HmacSha256(const std::array<uint8_t, 32>& key, std::string_view data);
// A 256-bit key for one use of `secret`: HMAC-SHA256(secret, label). Each
// use has its own label, so no two uses share a key (and none is the bearer
// token that travels in HTTP headers).
std::array<uint8_t, 32> DeriveKey(std::string_view secret, std::string_view label);
// Constant time (CRYPTO_memcmp).
bool DigestsEqual(const Digest& a, const Digest& b);
// Lower-case hex, 64 characters.
std::string HexOf(const Digest& d);

}  // namespace kvbridge::internal
