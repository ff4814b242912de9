#include "bench/reference.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>

namespace kvbridge::bench {

Throughput MemcpyReference(const uint8_t* src, uint8_t* dst, const BlockPattern& pattern,
                           uint64_t bytes) {
  const uint64_t bs = pattern.block_size();
  const uint64_t blocks = bytes / bs;
  auto start = Clock::now();
  for (uint64_t i = 0; i < blocks; ++i) {
    std::memcpy(dst + pattern.dst_offset(i), src + pattern.src_offset(i), bs);
  }
  Throughput t;
  t.seconds = SecondsSince(start);
  t.bytes = blocks * bs;
  t.blocks = blocks;
  return t;
}

namespace {

// Closes the fd on scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

Status Errno(const char* what) { return InternalError(std::string(what) + ": " + strerror(errno)); }

}  // namespace

Result<Throughput> SocketReference(const uint8_t* src, uint8_t* dst, const BlockPattern& pattern,
                                   uint64_t bytes) {
  Fd listener(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (listener.fd < 0) return Errno("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t addr_len = sizeof(addr);
  if (bind(listener.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno("bind 127.0.0.1");
  }
  if (listen(listener.fd, 1) != 0) return Errno("listen");
  if (getsockname(listener.fd, reinterpret_cast<sockaddr*>(&addr), &addr_len) != 0) {
    return Errno("getsockname");
  }
  Fd sender(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (sender.fd < 0) return Errno("socket");
  if (connect(sender.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno("connect 127.0.0.1");
  }
  Fd receiver(accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC));
  if (receiver.fd < 0) return Errno("accept");

  const uint64_t bs = pattern.block_size();
  const uint64_t blocks = bytes / bs;
  auto start = Clock::now();
  int send_errno = 0;
  std::thread send_thread([&] {
    for (uint64_t i = 0; i < blocks && send_errno == 0; ++i) {
      const uint8_t* p = src + pattern.src_offset(i);
      uint64_t left = bs;
      while (left > 0) {
        ssize_t n = send(sender.fd, p, left, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
          send_errno = errno;
          break;
        }
        p += n;
        left -= static_cast<uint64_t>(n);
      }
    }
  });
  int recv_errno = 0;
  for (uint64_t i = 0; i < blocks && recv_errno == 0; ++i) {
    uint8_t* p = dst + pattern.dst_offset(i);
    uint64_t left = bs;
    while (left > 0) {
      ssize_t n = recv(receiver.fd, p, left, MSG_WAITALL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        recv_errno = n == 0 ? EPIPE : errno;
        break;
      }
      p += n;
      left -= static_cast<uint64_t>(n);
    }
  }
  Throughput t;
  t.seconds = SecondsSince(start);
  if (recv_errno != 0) shutdown(sender.fd, SHUT_RDWR);  // unblock the sender
  send_thread.join();
  if (send_errno != 0 || recv_errno != 0) {
    errno = send_errno != 0 ? send_errno : recv_errno;
    return Errno("loopback socket transfer");
  }
  t.bytes = blocks * bs;
  t.blocks = blocks;
  // The reference must itself move the right bytes.
  for (uint64_t i : {uint64_t{0}, blocks / 2, blocks - 1}) {
    if (std::memcmp(dst + pattern.dst_offset(i), src + pattern.src_offset(i), bs) != 0) {
      return DataLossError("loopback socket reference delivered wrong bytes");
    }
  }
  return t;
}

}  // namespace kvbridge::bench
