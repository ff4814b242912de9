// Serving an httplib::Server on a thread of its own: the bind, start and stop
// that BootstrapServer and MetricsServer share. Routes and settings are the
// caller's, set on the server before Start.
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <thread>

#include "kvbridge/status.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace kvbridge::internal {

// "host:port", an IPv6 host in brackets.
std::string JoinHostPort(const std::string& host, int port);

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
