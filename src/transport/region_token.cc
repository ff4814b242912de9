#include "transport/region_token.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace kvbridge::internal {
namespace {

bool ReadUrandom(uint8_t* out, size_t length) {
  const int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  size_t got = 0;
  while (got < length) {
    const ssize_t n = read(fd, out + got, length - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  return got == length;
}

}  // namespace

Status SecureRandomBytes(void* out, size_t length) {
  auto* p = static_cast<uint8_t*>(out);
  size_t got = 0;
  while (got < length) {
    const ssize_t n = getrandom(p + got, length - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (got == length || ReadUrandom(p + got, length - got)) return Status::Ok();
  return InternalError("no kernel randomness (getrandom and /dev/urandom failed: " +
                       std::string(std::strerror(errno)) + ")");
}

Result<RegionToken> NewRegionToken() {
  RegionToken t;
  KVB_RETURN_IF_ERROR(SecureRandomBytes(t.bytes.data(), t.bytes.size()));
  return t;
}

Result<uint64_t> SecureRandomU64() {
  uint64_t v = 0;
  while (v == 0) KVB_RETURN_IF_ERROR(SecureRandomBytes(&v, sizeof(v)));
  return v;
}

bool TokensEqual(const RegionToken& a, const RegionToken& b) {
  // Every byte is looked at; the volatile read keeps the compiler from
  // turning the loop into an early-exit memcmp.
  uint8_t diff = 0;
  for (size_t i = 0; i < a.bytes.size(); ++i)
    diff = static_cast<uint8_t>(diff | (a.bytes[i] ^ b.bytes[i]));
  volatile uint8_t result = diff;
  return result == 0;
}

bool IsZeroToken(const RegionToken& t) { return TokensEqual(t, RegionToken{}); }

}  // namespace kvbridge::internal
