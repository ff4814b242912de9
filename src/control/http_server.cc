#include "control/http_server.h"

#include <fcntl.h>
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>

#include "common/log.h"
#include "common/process.h"

namespace kvbridge::internal {
namespace {

using Micros = std::chrono::microseconds;
using Clock = std::chrono::steady_clock;

// httplib keeps its one-request entry and its timeouts protected. A class
// derived from it names them with using-declarations; a pointer to such a
// member is a pointer to httplib::Server's own, valid on any server. Never
// instantiated.
struct ServerAccess : httplib::Server {
  using httplib::Server::keep_alive_max_count_;
  using httplib::Server::keep_alive_timeout_sec_;
  using httplib::Server::process_request;
  using httplib::Server::read_timeout_sec_;
  using httplib::Server::read_timeout_usec_;
  using httplib::Server::write_timeout_sec_;
  using httplib::Server::write_timeout_usec_;
};

// A whole request already in memory, read by httplib as a stream: its
// bytes, then end of stream. How the answer leaves is the subclass's.
class InMemoryRequest : public httplib::Stream {
 public:
  explicit InMemoryRequest(std::string_view request) : in_(request) {}
  bool is_readable() const override { return pos_ < in_.size(); }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, in_.size() - pos_);
    std::memcpy(ptr, in_.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }

 private:
  const std::string_view in_;
  size_t pos_ = 0;
};

// A request's bytes in, the answer's bytes out.
class StringStream final : public InMemoryRequest {
 public:
  using InMemoryRequest::InMemoryRequest;
  bool is_writable() const override { return true; }
  ssize_t write(const char* ptr, size_t size) override {
    out_.append(ptr, size);
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 0;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 0;
  }
  socket_t socket() const override { return INVALID_SOCKET; }
  std::string& out() { return out_; }

 private:
  std::string out_;
};

constexpr int kDefaultBacklog = 5;  // httplib's
constexpr size_t kReadChunk = 16 << 10;
// After a refusal the client may still be sending its request; closing with
// unread bytes resets the connection, and the client may never read the
// answer. So up to this much more than the declared body (itself dropped
// up to kMaxDrainBody) is read and dropped, within kDrainTime.
constexpr size_t kDrainBytes = 1 << 20;
constexpr size_t kMaxDrainBody = 16 << 20;
constexpr auto kDrainTime = std::chrono::seconds(2);
// How long the listener waits before it accepts again when out of fds.
constexpr auto kAcceptBackoff = std::chrono::milliseconds(10);

Micros ToMicros(time_t sec, time_t usec) {
  return Micros(static_cast<int64_t>(sec) * 1000000 + static_cast<int64_t>(usec));
}

// The settings httplib would serve a connection with.
struct ServerTimeouts {
  Micros read, write, idle;  // a read within a request, a write, between requests
  size_t max_requests;       // on one connection
};

ServerTimeouts TimeoutsOf(const httplib::Server& s) {
  return ServerTimeouts{
      ToMicros(s.*(&ServerAccess::read_timeout_sec_), s.*(&ServerAccess::read_timeout_usec_)),
      ToMicros(s.*(&ServerAccess::write_timeout_sec_), s.*(&ServerAccess::write_timeout_usec_)),
      ToMicros(s.*(&ServerAccess::keep_alive_timeout_sec_), 0),
      s.*(&ServerAccess::keep_alive_max_count_)};
}

// poll() on `fds`, again after EINTR, until `timeout` (Micros::max(): none).
int PollFor(pollfd* fds, nfds_t n, Micros timeout) {
  const bool forever = timeout == Micros::max();
  const Clock::time_point deadline = forever ? Clock::time_point::max() : Clock::now() + timeout;
  for (;;) {
    int ms = -1;
    if (!forever) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      ms = static_cast<int>(std::clamp<int64_t>(left.count(), 0, INT_MAX));
    }
    const int r = ::poll(fds, n, ms);
    if (r >= 0 || errno != EINTR) return r;
  }
}

bool Writable(int fd, Micros timeout) {
  pollfd p{fd, POLLOUT, 0};
  return PollFor(&p, 1, timeout) > 0 && (p.revents & POLLOUT) != 0;
}

bool WriteAll(int fd, std::string_view data, Micros timeout) {
  while (!data.empty()) {
    if (!Writable(fd, timeout)) return false;
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

struct Endpoints {
  std::string remote_ip, local_ip;
  int remote_port = -1, local_port = -1;
};

void NumericAddress(const sockaddr_storage& addr, socklen_t len, std::string* ip, int* port) {
  char host[NI_MAXHOST];
  char serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof(host), serv,
                  sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    *ip = host;
    *port = std::atoi(serv);
  }
}

// The addresses httplib would give its handlers (req.remote_addr, ...).
Endpoints EndpointsOf(int fd) {
  Endpoints e;
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    NumericAddress(addr, len, &e.remote_ip, &e.remote_port);
  }
  len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    NumericAddress(addr, len, &e.local_ip, &e.local_port);
  }
  return e;
}

// What httplib reads one request from: the request's bytes, already
// complete and within bounds, then end of stream; its answer goes to the
// client's socket, each write within the server's write timeout.
class FrontStream final : public InMemoryRequest {
 public:
  FrontStream(int fd, std::string_view request, const Endpoints& ends, Micros write_timeout)
      : InMemoryRequest(request), fd_(fd), ends_(ends), write_timeout_(write_timeout) {}
  bool is_writable() const override { return Writable(fd_, write_timeout_); }
  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    for (;;) {
      const ssize_t n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
      if (n >= 0 || errno != EINTR) return n;
    }
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = ends_.remote_ip;
    port = ends_.remote_port;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = ends_.local_ip;
    port = ends_.local_port;
  }
  socket_t socket() const override { return fd_; }

 private:
  const int fd_;
  const Endpoints& ends_;
  const Micros write_timeout_;
};

Status ListenError(const std::string& what, const std::string& where, int err) {
  Status s =
      err == EADDRINUSE
          ? AlreadyExistsError(what + " cannot listen on " + where + ": address already in use")
          : UnavailableError(what + " cannot listen on " + where + ": " +
                             (err != 0 ? std::strerror(err) : "cannot resolve or bind the host"));
  KVB_LOG_ERROR("{}", s.message());
  return s;
}

// A listening socket on host:port: SO_REUSEADDR, not SO_REUSEPORT.
Result<int> Listen(const std::string& host, int port, int backlog, const std::string& what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string where = JoinHostPort(host, port);
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) {
    return ListenError(what, where, 0);
  }
  int err = 0;
  int fd = -1;
  for (addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, backlog) != 0) {
      err = errno;
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) return ListenError(what, where, err);
  return fd;
}

int BoundPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  std::string ip;
  int port = 0;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    NumericAddress(addr, len, &ip, &port);
  }
  return port;
}

}  // namespace

std::string AnswerFromMemory(httplib::Server& http, std::string_view raw_request) {
  StringStream stream(raw_request);
  bool closed = false;
  (http.*(&ServerAccess::process_request))(stream, /*close_connection=*/true, closed,
                                           [](httplib::Request&) {});
  return std::move(stream.out());
}

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
                               const std::string& what, const HttpServeOptions& options) {
  const int backlog = options.backlog > 0 ? options.backlog : kDefaultBacklog;
  KVB_ASSIGN_OR_RETURN(int fd, Listen(host, port, backlog, what));
  if (::pipe2(wake_, O_CLOEXEC) != 0) {
    const int err = errno;
    ::close(fd);
    return ListenError(what, JoinHostPort(host, port), err);
  }
  listen_fd_ = fd;
  port_ = BoundPort(fd);
  address_ = JoinHostPort(host, port_);
  http_ = &http;
  options_ = options;
  what_ = what;
  queue_ = std::make_unique<ConnectionThreads>(options.max_connections);
  acceptor_ = std::thread([this] { AcceptLoop(); });
  std::lock_guard<std::mutex> lock(stop_mu_);
  started_ = true;
  return Status::Ok();
}

bool HttpServerThread::Stop() {
  std::lock_guard<std::mutex> lock(stop_mu_);
  if (stopped_ || !started_) return false;
  stopped_ = true;
  {
    std::lock_guard<std::mutex> open_lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  const char byte = 0;
  while (::write(wake_[1], &byte, 1) < 0 && errno == EINTR) {
  }
  acceptor_.join();
  ::close(listen_fd_);
  // Runs the connections still queued (they close at once) and joins.
  queue_->shutdown();
  queue_.reset();

  ::close(wake_[0]);
  ::close(wake_[1]);
  return true;
}

int HttpServerThread::WaitReadable(int fd, Micros timeout, bool wake) const {
  pollfd fds[2] = {{fd, POLLIN, 0}, {wake_[0], POLLIN, 0}};
  const int r = PollFor(fds, wake ? 2 : 1, timeout);
  if (r <= 0) return r;
  if (wake && fds[1].revents != 0) return -1;
  return 1;
}

void HttpServerThread::AcceptLoop() {
  NameThisThread("kvb-http-front");
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || open_ < options_.max_connections; });
      if (stopping_) return;
    }
    if (WaitReadable(listen_fd_, Micros::max(), true) < 0) return;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, kAcceptBackoff, [this] { return stopping_.load(); });
      }
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++open_;
    }
    queue_->enqueue([this, fd] {
      if (!stopping_) Serve(fd);
      ::shutdown(fd, SHUT_RDWR);
      ::close(fd);
      {
        std::lock_guard<std::mutex> lock(mu_);
        --open_;
      }
      cv_.notify_all();
    });
  }
}

void HttpServerThread::Serve(int fd) {
  const ServerTimeouts t = TimeoutsOf(*http_);
  // A blocking send waits until all of a write is queued: a client that
  // stops reading would hold the thread, and Stop(), for good (review
  // finding). Each send gives up after the write timeout, as httplib's did.
  const auto write_s = std::chrono::duration_cast<std::chrono::seconds>(t.write);
  timeval send_timeout{static_cast<time_t>(write_s.count()),
                       static_cast<suseconds_t>((t.write - write_s).count())};
  if (t.write != Micros::max())
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
  const Endpoints ends = EndpointsOf(fd);
  HttpRequestFramer framer(options_.limits);
  size_t served = 0;
  char chunk[kReadChunk];
  for (;;) {
    const HttpRequestFramer::Event event = framer.Next();
    if (event == HttpRequestFramer::Event::kRefused) {
      Refuse(fd, framer.refusal(), framer.declared_body());
      return;
    }
    if (event == HttpRequestFramer::Event::kRequest) {
      const std::string request = framer.TakeRequest();
      const bool last = ++served >= t.max_requests || stopping_;
      FrontStream stream(fd, request, ends, t.write);
      bool closed = false;
      if (!(http_->*(&ServerAccess::process_request))(stream, last, closed,
                                                      [](httplib::Request&) {}) ||
          closed || last) {
        return;
      }
      continue;
    }
    if (framer.TakeContinue() && !WriteAll(fd, "HTTP/1.1 100 Continue\r\n\r\n", t.write)) {
      return;
    }
    // Stop() closes the connection, between requests and within one (a
    // request trickled in within each read timeout would hold it for days).
    const bool idle = framer.idle();
    if (WaitReadable(fd, idle ? t.idle : t.read, /*wake=*/true) <= 0) return;
    ssize_t n;
    do {
      n = ::recv(fd, chunk, sizeof(chunk), 0);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) return;
    framer.Feed(std::string_view(chunk, static_cast<size_t>(n)));
  }
}

void HttpServerThread::Refuse(int fd, const HttpRefusal& refusal, size_t declared_body) const {
  KVB_LOG_DEBUG("{}: refused a request (HTTP {}): {}", what_, refusal.http_status,
                refusal.status.ToString());
  if (!WriteAll(fd, RefusalResponse(refusal), TimeoutsOf(*http_).write)) return;
  ::shutdown(fd, SHUT_WR);
  size_t budget = kDrainBytes + std::min(declared_body, kMaxDrainBody);
  const Clock::time_point deadline = Clock::now() + kDrainTime;
  char chunk[kReadChunk];
  while (budget > 0) {
    const auto left = std::chrono::duration_cast<Micros>(deadline - Clock::now());
    if (left <= Micros::zero() || WaitReadable(fd, left, true) <= 0) return;
    const ssize_t n = ::recv(fd, chunk, std::min(sizeof(chunk), budget), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    budget -= static_cast<size_t>(n);
  }
}

}  // namespace kvbridge::internal
