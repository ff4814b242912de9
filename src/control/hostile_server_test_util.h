// A hostile HTTP server for tests: a thread on 127.0.0.1 that accepts one
// connection, reads the request head and then writes whatever bytes its
// script says, counting what the client let it send. No sleeps: the script
// paces itself by polling the client socket (which also sees it close).
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <thread>

namespace kvbridge::internal::testing {

class HostilePeer {
 public:
  explicit HostilePeer(int fd) : fd_(fd) {}

  // Sends all of `bytes`; false once the client has gone (reset, closed, or
  // not reading for 10 s).
  bool Send(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent_ += static_cast<size_t>(n);
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }
  // `total` bytes of `fill` in pieces of 64 KiB: false once the client went.
  bool SendFill(size_t total, char fill = 'a') {
    const std::string piece(64 << 10, fill);
    for (size_t left = total; left > 0;) {
      const size_t n = std::min(left, piece.size());
      if (!Send(std::string_view(piece).substr(0, n))) return false;
      left -= n;
    }
    return true;
  }
  // Waits up to `wait` for the client to close: true if it did.
  bool ClosedWithin(std::chrono::milliseconds wait) {
    pollfd p{fd_, POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, static_cast<int>(wait.count())) <= 0) return false;
    char c;
    return (p.revents & (POLLHUP | POLLERR | POLLRDHUP)) != 0 ||
           ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) <= 0;
  }
  // Shuts the connection down (the client reads the end of the stream).
  void Close() { ::shutdown(fd_, SHUT_RDWR); }
  size_t sent() const { return sent_; }

 private:
  int fd_;
  size_t sent_ = 0;
};

class HostileServer {
 public:
  using Script = std::function<void(HostilePeer&)>;

  explicit HostileServer(Script script) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 ||
        ::listen(listen_fd_, 4) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      return;
    }
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this, script = std::move(script)] { Serve(script); });
  }
  ~HostileServer() { Join(); }

  int port() const { return port_; }
  // Waits for the script to end; afterwards sent() is what it managed to send.
  void Join() {
    if (thread_.joinable()) thread_.join();
    if (listen_fd_ >= 0) ::close(listen_fd_);
    listen_fd_ = -1;
  }
  size_t sent() const { return sent_.load(); }
  bool accepted() const { return accepted_.load(); }

 private:
  void Serve(const Script& script) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 10000) <= 0) return;  // no client within 10 s
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    accepted_ = true;
    // A small send buffer: what the client did not read stays here, not in
    // the kernel. A client that stops reading fails the send after 10 s.
    const int buf = 64 << 10;
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ReadHead(fd);
    HostilePeer peer(fd);
    script(peer);
    sent_ = peer.sent();
    ::close(fd);
  }
  // The request's head (up to its blank line, at most 64 KiB; the requests
  // these tests make have no body).
  static void ReadHead(int fd) {
    std::string head;
    char c[4096];
    while (head.find("\r\n\r\n") == std::string::npos && head.size() < (64 << 10)) {
      const ssize_t n = ::recv(fd, c, sizeof(c), 0);
      if (n <= 0) return;
      head.append(c, static_cast<size_t>(n));
    }
  }

  int listen_fd_ = -1;
  int port_ = 0;
  std::thread thread_;
  std::atomic<size_t> sent_{0};
  std::atomic<bool> accepted_{false};
};

// Bytes a hostile server offers in the floods below, and the most a client
// that stops at its bounds lets it send before it is gone.
inline constexpr size_t kFlood = size_t{64} << 20;
inline constexpr size_t kMaxSentBeforeClose = size_t{8} << 20;

// Answers that never end, each past a different bound of the client.
inline HostileServer::Script EndlessHeaderLine() {
  return [](HostilePeer& p) {
    if (p.Send("HTTP/1.1 200 OK\r\nX-Endless: ")) p.SendFill(kFlood);
  };
}
inline HostileServer::Script EndlessChunkedBody() {
  return [](HostilePeer& p) {
    if (!p.Send("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")) return;
    const std::string chunk = "10000\r\n" + std::string(0x10000, ' ') + "\r\n";
    for (size_t i = 0; i < kFlood / 0x10000; ++i) {
      if (!p.Send(chunk)) return;
    }
  };
}
inline HostileServer::Script HugeContentLength() {
  return [](HostilePeer& p) {
    if (p.Send("HTTP/1.1 200 OK\r\nContent-Length: 10000000000\r\n\r\n")) p.SendFill(kFlood);
  };
}
// A byte of its head every 100 ms, for up to 30 s: each read comes well
// within any per-read timeout; only a deadline for the whole call ends it.
inline HostileServer::Script Trickle() {
  return [](HostilePeer& p) {
    const std::string head = "HTTP/1.1 200 OK\r\nX-Slow: " + std::string(300, 's');
    for (char c : head) {
      if (!p.Send(std::string_view(&c, 1)) || p.ClosedWithin(std::chrono::milliseconds(100)))
        return;
    }
  };
}

}  // namespace kvbridge::internal::testing
