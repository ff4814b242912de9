#include "control/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/log.h"

namespace kvbridge::internal {
namespace {

constexpr auto kStartTimeout = std::chrono::seconds(10);

}  // namespace

std::string JoinHostPort(const std::string& host, int port) {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

HttpServerThread::~HttpServerThread() { Stop(); }

Status HttpServerThread::Start(httplib::Server& http, const std::string& host, int port,
                               const std::string& what, int backlog) {
  std::atomic<int>* last_socket = &last_socket_;
  http.set_socket_options([last_socket](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    last_socket->store(sock);
  });
  errno = 0;
  bool bound;
  int bound_port = port;
  if (port == 0) {
    bound_port = http.bind_to_any_port(host);
    bound = bound_port > 0;
  } else {
    bound = http.bind_to_port(host, port);
  }
  const int bind_errno = errno;
  const std::string where = JoinHostPort(host, port);
  if (!bound) {
    Status s =
        bind_errno == EADDRINUSE
            ? AlreadyExistsError(what + " cannot listen on " + where + ": address already in use")
            : UnavailableError(what + " cannot listen on " + where + ": " +
                               (bind_errno != 0 ? std::strerror(bind_errno)
                                                : "cannot resolve or bind the host"));
    KVB_LOG_ERROR("{}", s.message());
    return s;
  }
  // listen() again on a listening socket only updates its backlog.
  if (int fd = last_socket_.load(); backlog > 0 && fd >= 0) ::listen(fd, backlog);
  port_ = bound_port;
  address_ = JoinHostPort(host, bound_port);

  httplib::Server* server = &http;
  thread_ = std::thread([server] { server->listen_after_bind(); });
  const auto deadline = std::chrono::steady_clock::now() + kStartTimeout;
  while (!http.is_running()) {
    if (std::chrono::steady_clock::now() > deadline) {
      http.stop();
      thread_.join();
      return InternalError(what + " on " + address_ + " did not start serving");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::lock_guard<std::mutex> lock(stop_mu_);
  http_ = &http;
  return Status::Ok();
}

bool HttpServerThread::Stop() {
  std::lock_guard<std::mutex> lock(stop_mu_);
  if (stopped_ || http_ == nullptr) return false;
  stopped_ = true;
  http_->stop();
  if (thread_.joinable()) thread_.join();
  return true;
}

}  // namespace kvbridge::internal
