#include "control/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/log.h"
#include "common/process.h"

namespace kvbridge::internal {
namespace {

constexpr auto kStartTimeout = std::chrono::seconds(10);

}  // namespace

std::string JoinHostPort(const std::string& host, int port) {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

void ConnectionThreads::enqueue(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.push_back(std::move(fn));
  if (idle_ >= jobs_.size()) {
    cv_.notify_one();
  } else if (threads_.size() < max_threads_ && !shutdown_) {
    threads_.emplace_back([this] { Work(); });
  }
}

void ConnectionThreads::shutdown() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
    threads.swap(threads_);
  }
  cv_.notify_all();
  for (std::thread& t : threads) t.join();
}

size_t ConnectionThreads::threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return threads_.size();
}

void ConnectionThreads::Work() {
  NameThisThread("kvb-http-conn");
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    ++idle_;
    cv_.wait(lock, [this] { return !jobs_.empty() || shutdown_; });
    --idle_;
    if (jobs_.empty()) return;  // shut down with nothing left to serve
    std::function<void()> fn = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    fn();
    lock.lock();
  }
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
  thread_ = std::thread([server] {
    NameThisThread("kvb-http");
    server->listen_after_bind();
  });
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
