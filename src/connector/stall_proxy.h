// Tests: a TCP relay on loopback in front of a server (the bootstrap
// registry) that can be stalled. While stalled it relays nothing, in either
// direction, on any connection, and new connections are accepted and never
// answered: the server then looks like one that accepts connections and
// never answers. Resume() relays again.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kvbridge::internal {

class StallProxy {
 public:
  // `upstream`: "127.0.0.1:PORT".
  explicit StallProxy(const std::string& upstream) {
    const size_t colon = upstream.rfind(':');
    if (colon == std::string::npos) return;
    upstream_port_ = std::stoi(upstream.substr(colon + 1));
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = Loopback(0);
    socklen_t len = sizeof(a);
    if (listen_fd_ < 0 || bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 ||
        listen(listen_fd_, 128) != 0 ||
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      return;
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { AcceptLoop(); });
  }
  ~StallProxy() {
    stop_ = true;
    if (acceptor_.joinable()) acceptor_.join();
    std::lock_guard<std::mutex> lock(mu_);
    for (std::thread& t : relays_) t.join();
    if (listen_fd_ >= 0) close(listen_fd_);
  }
  StallProxy(const StallProxy&) = delete;
  StallProxy& operator=(const StallProxy&) = delete;

  bool ok() const { return port_ != 0; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  void Stall() { stalled_ = true; }
  void Resume() { stalled_ = false; }

 private:
  static sockaddr_in Loopback(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    return a;
  }

  void AcceptLoop() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const int client = accept(listen_fd_, nullptr, nullptr);
      if (client < 0) continue;
      std::lock_guard<std::mutex> lock(mu_);
      relays_.emplace_back([this, client] { Relay(client); });
    }
  }

  // One connection, until either side closes or the proxy stops; the
  // upstream connection is made when the first bytes may pass.
  void Relay(int client) {
    int server = -1;
    while (!stop_) {
      if (stalled_) {
        poll(nullptr, 0, 20);  // polling interval: relays nothing meanwhile
        continue;
      }
      if (server < 0) {
        server = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a = Loopback(upstream_port_);
        if (server < 0 || connect(server, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) break;
      }
      pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (poll(p, 2, 20) <= 0) continue;
      if (!Pass(p[0], server) || !Pass(p[1], client)) break;
    }
    close(client);
    if (server >= 0) close(server);
  }

  // Moves what `from` has to `to`; false when the connection is done.
  bool Pass(const pollfd& from, int to) {
    if (from.revents == 0) return true;
    char buf[16384];
    const ssize_t n = recv(from.fd, buf, sizeof(buf), 0);
    if (n <= 0) return false;
    for (ssize_t sent = 0; sent < n;) {
      const ssize_t k = send(to, buf + sent, n - sent, MSG_NOSIGNAL);
      if (k <= 0) return false;
      sent += k;
    }
    return true;
  }

  int listen_fd_ = -1;
  int port_ = 0;
  int upstream_port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> stalled_{false};
  std::mutex mu_;
  std::vector<std::thread> relays_;  // one per connection, joined at the end
  std::thread acceptor_;
};

}  // namespace kvbridge::internal
