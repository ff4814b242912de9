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
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <list>
#include <memory>
#include <string>
#include <thread>

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
    for (Relaying& r : relays_) r.thread.join();
    if (listen_fd_ >= 0) close(listen_fd_);
  }
  StallProxy(const StallProxy&) = delete;
  StallProxy& operator=(const StallProxy&) = delete;

  bool ok() const { return port_ != 0; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  void Stall() {
    drop_held_ = false;
    stalled_ = true;
  }
  void Resume() { stalled_ = false; }
  // Resumes, but every connection that was held while stalled is closed
  // with what it held unsent (a request that timed out never reaches the
  // server late); connections made from now on relay as before (until the
  // next Stall, which forgets the drop).
  void ResumeDroppingHeld() {
    drop_held_ = true;
    stalled_ = false;
  }

 private:
  static sockaddr_in Loopback(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    return a;
  }

  // One relay thread per connection; finished ones are joined here.
  struct Relaying {
    std::shared_ptr<std::atomic<bool>> done = std::make_shared<std::atomic<bool>>(false);
    std::thread thread;
  };

  void AcceptLoop() {
    while (!stop_) {
      std::erase_if(relays_, [](Relaying& r) {
        if (!r.done->load()) return false;
        r.thread.join();
        return true;
      });
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const int client = accept(listen_fd_, nullptr, nullptr);
      if (client < 0) continue;
      Relaying& r = relays_.emplace_back();
      r.thread = std::thread([this, client, done = r.done] {
        Relay(client);
        done->store(true);
      });
    }
  }

  // Sends give up after 1 s: a side that stopped reading cannot hold the
  // relay (and the destructor's join) for ever.
  static void BoundSends(int fd) {
    timeval t{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &t, sizeof(t));
  }

  // One connection, until either side closes or the proxy stops; the
  // upstream connection is made when the first bytes may pass.
  void Relay(int client) {
    BoundSends(client);
    int server = -1;
    bool held = false;
    while (!stop_) {
      if (stalled_) {
        held = true;
        poll(nullptr, 0, 20);  // polling interval: relays nothing meanwhile
        continue;
      }
      if (held && drop_held_) break;
      if (server < 0) {
        server = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a = Loopback(upstream_port_);
        if (server < 0 || connect(server, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) break;
        BoundSends(server);
      }
      pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (poll(p, 2, 20) <= 0 || stalled_) continue;  // stalled meanwhile: nothing passes
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
  std::atomic<bool> drop_held_{false};
  std::list<Relaying> relays_;  // the acceptor's; joined when done, or at the end
  std::thread acceptor_;
};

}  // namespace kvbridge::internal
