// What the transport integration test and its peer program agree on: the
// byte pattern written (derived from the target offset and a seed), the
// control-message format, and hex encoding of blobs on the pipes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

namespace kvbridge::testing {

// The 64-bit word at byte offset `offset` (a multiple of 8) for `seed`.
inline uint64_t PatternWord(uint64_t offset, uint64_t seed) {
  uint64_t x = (offset / 8 + 1) * 0x9E3779B97F4A7C15ULL ^ seed;
  x ^= x >> 29;
  return x;
}

inline void FillPattern(uint8_t* base, uint64_t offset, uint64_t length, uint64_t seed) {
  auto* w = reinterpret_cast<uint64_t*>(base + offset);
  for (uint64_t i = 0; i < length / 8; ++i) w[i] = PatternWord(offset + i * 8, seed);
}

// Offset of the first byte in [offset, offset + length) that does not match.
// Not instrumented by ThreadSanitizer: the memory was written by another
// process's transfer (placed here by this process's UCX thread, a memcpy
// TSan sees when active messages are gathered) and the check's order comes
// from that process over a pipe, which TSan cannot see. Instrumented, every
// word was a suppressed race, each one slow enough to stall the check of a
// few MiB past its 20 s limit (CI on 4d71d6f).
__attribute__((no_sanitize("thread"))) inline std::optional<uint64_t> FindPatternMismatch(
    const uint8_t* base, uint64_t offset, uint64_t length, uint64_t seed) {
  const auto* w = reinterpret_cast<const uint64_t*>(base + offset);
  for (uint64_t i = 0; i < length / 8; ++i) {
    if (w[i] != PatternWord(offset + i * 8, seed)) return offset + i * 8;
  }
  return std::nullopt;
}

inline std::string ToHex(std::string_view bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

inline std::optional<std::string> FromHex(std::string_view hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out.push_back(static_cast<char>(hi << 4 | lo));
  }
  return out;
}

// Control messages (test -> peer), checked by the peer on receipt:
//   "CHECK <seq> <offset> <length> <seed>"  bytes must hold the pattern
//   "ZERO <seq> <offset> <length>"          bytes must all be zero
// The peer answers on stdout "ACK <seq> OK" or "ACK <seq> FAIL <why>"; seq
// must count 1, 2, 3, ... (messages in order).

}  // namespace kvbridge::testing
