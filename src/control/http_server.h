// Serving an httplib::Server behind a bounded front: the bind, start and
// stop that BootstrapServer, MetricsServer and RankEndpoint share. Routes
// and settings are the caller's, set on the server before Start.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "control/http_front.h"
#include "kvbridge/status.h"

namespace kvbridge::internal {

// "host:port", an IPv6 host in brackets.
std::string JoinHostPort(const std::string& host, int port);

// httplib's answer to `raw_request` (one request's bytes), through its own
// request processing with no socket and no front (for the fuzz target and
// tests of the handlers).
std::string AnswerFromMemory(httplib::Server& http, std::string_view raw_request);

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

// How HttpServerThread serves: the listen backlog, the bounds of the front
// (see HttpRequestFramer) and how many client connections it keeps open.
struct HttpServeOptions {
  // > 0 widens the listen backlog (5 otherwise, as httplib's).
  int backlog = 0;
  // Line, head, header and body bounds; set max_body_bytes per server.
  HttpFrontLimits limits;
  // Connections open at once; further clients wait in the listen backlog
  // until one closes. Each open connection has a thread (ConnectionThreads,
  // started as needed, up to this many); the server's new_task_queue is not
  // used (httplib's ThreadPool hands work over where ThreadSanitizer cannot
  // see it: tests/tsan.supp).
  size_t max_connections = 64;
};

// Serves an httplib::Server on threads of its own, behind a bounded front.
//
// httplib 0.11.4 reads without bounds (see HttpRequestFramer), so httplib
// never sees a socket: HttpServerThread binds and listens itself, accepts,
// and on each connection reads requests with a framer that refuses, with a
// JSON error and a close, whatever breaks a bound. Each whole request is
// handed from memory to httplib's own request processing
// (Server::process_request: the same parsing, pre-routing, routing,
// handlers, error handler and post-routing as on httplib's socket), whose
// answer is written to the client. So routes and handlers need no change,
// and there is no second, internal port that a local process could reach.
// The server's read, write and keep-alive timeouts and its keep-alive
// request count are honoured as httplib would.
class HttpServerThread {
 public:
  HttpServerThread() = default;
  ~HttpServerThread();  // Stop()s.
  HttpServerThread(const HttpServerThread&) = delete;
  HttpServerThread& operator=(const HttpServerThread&) = delete;

  // Listens on host:port (port 0: a free one), serves `http` on new threads
  // and returns once it accepts connections. The socket gets SO_REUSEADDR
  // but not SO_REUSEPORT, which would let a second server bind a live port
  // and split the clients between the two; a quick restart still works.
  // `what` ("bootstrap server") begins error messages. `http` must outlive
  // this object; its listen functions are never called. Call once.
  // Errors: AlreadyExists (address in use), Unavailable (any other failure
  // to resolve, bind or listen).
  Status Start(httplib::Server& http, const std::string& host, int port, const std::string& what,
               const HttpServeOptions& options = {});
  // Stops accepting, closes idle connections, finishes requests in flight,
  // joins every thread and closes every socket. True on the call that
  // stopped a started server; false before Start succeeded and after.
  // Thread-safe.
  bool Stop();

  int port() const { return port_; }                       // as bound
  const std::string& address() const { return address_; }  // "host:port" as bound

 private:
  void AcceptLoop();
  // Reads and answers the requests of one connection until it is to close.
  void Serve(int fd);
  // Waits until `fd` is readable: 1; timed out: 0; Stop() while `wake`: -1.
  int WaitReadable(int fd, std::chrono::microseconds timeout, bool wake) const;
  // Answers `refusal`, then reads and drops what the client still sends
  // (bounded) so that it reads the answer rather than a reset.
  void Refuse(int fd, const HttpRefusal& refusal, size_t declared_body) const;

  httplib::Server* http_ = nullptr;
  HttpServeOptions options_;
  std::string what_;
  std::unique_ptr<httplib::TaskQueue> queue_;
  std::thread acceptor_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // a pipe; its read end turns readable on Stop
  int port_ = 0;
  std::string address_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::condition_variable cv_;  // open_ fell, or stopping_
  size_t open_ = 0;             // guarded by mu_: connections accepted, not yet closed
  std::mutex stop_mu_;
  bool started_ = false;  // GUARDED_BY(stop_mu_)
  bool stopped_ = false;  // GUARDED_BY(stop_mu_)
};

}  // namespace kvbridge::internal
