// Serving an httplib::Server on a thread of its own: the bind, start and stop
// that BootstrapServer and MetricsServer share. Routes and settings are the
// caller's, set on the server before Start.
#pragma once

#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kvbridge/status.h"

namespace kvbridge::internal {

// "host:port", an IPv6 host in brackets.
std::string JoinHostPort(const std::string& host, int port);

// httplib's task queue for a server that strangers can reach: a connection
// holds a thread for as long as its client keeps it (httplib reads a request
// with blocking reads), so a fixed pool of a few threads is starved by a
// few clients that trickle bytes or never send any. This queue starts a
// thread for each connection that finds none idle, up to `max_threads`;
// threads stay for later connections, and connections beyond the limit wait
// in order for a free one. Thread-safe (httplib calls it from its listener).
class ConnectionThreads final : public httplib::TaskQueue {
 public:
  explicit ConnectionThreads(size_t max_threads) : max_threads_(max_threads) {}
  ~ConnectionThreads() override { shutdown(); }

  void enqueue(std::function<void()> fn) override;
  // Runs what is queued, then joins every thread. Idempotent.
  void shutdown() override;

  size_t threads() const;  // started so far

 private:
  void Work();

  const size_t max_threads_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;  // guarded by mu_
  std::vector<std::thread> threads_;        // guarded by mu_
  size_t idle_ = 0;                         // guarded by mu_
  bool shutdown_ = false;                   // guarded by mu_
};

class HttpServerThread {
 public:
  HttpServerThread() = default;
  ~HttpServerThread();  // Stop()s.
  HttpServerThread(const HttpServerThread&) = delete;
  HttpServerThread& operator=(const HttpServerThread&) = delete;

  // Binds `http` to host:port (port 0: a free one), serves it on a new
  // thread and returns once it accepts requests. The socket gets
  // SO_REUSEADDR but not httplib's default SO_REUSEPORT, which would let a
  // second server bind a live port and split the clients between the two;
  // a quick restart still works. `backlog` > 0 widens the listen backlog
  // (httplib's is 5). `what` ("bootstrap server") begins error messages.
  // `http` must outlive this object. Call once.
  // Errors: AlreadyExists (address in use), Unavailable (any other bind
  // failure), Internal (not serving within 10 s).
  Status Start(httplib::Server& http, const std::string& host, int port, const std::string& what,
               int backlog = 0);
  // Stops accepting, finishes requests in flight, joins. True on the call
  // that stopped a started server; false before Start succeeded and after.
  // Thread-safe.
  bool Stop();

  int port() const { return port_; }                       // as bound
  const std::string& address() const { return address_; }  // "host:port" as bound

 private:
  httplib::Server* http_ = nullptr;  // set once serving
  std::thread thread_;
  int port_ = 0;
  std::string address_;
  std::atomic<int> last_socket_{-1};  // the listening socket, once bound
  std::mutex stop_mu_;
  bool stopped_ = false;  // GUARDED_BY(stop_mu_)
};

}  // namespace kvbridge::internal
