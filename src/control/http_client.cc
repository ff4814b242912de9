#include "control/http_client.h"

#include <fcntl.h>
#include <http_parser.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace kvbridge::internal {
namespace {

using Clock = std::chrono::steady_clock;

// Interim (1xx) answers skipped before the final one.
constexpr int kMaxInterimAnswers = 4;
// Bytes of a header name kept to compare with the wanted ones.
constexpr size_t kMaxFieldName = 256;
// Bytes read at a time.
constexpr size_t kReadChunk = 16 << 10;

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string Bytes(uint64_t n) {
  if (n >= (1u << 20) && n % (1u << 20) == 0) return std::to_string(n >> 20) + " MiB";
  if (n >= (1u << 10) && n % (1u << 10) == 0) return std::to_string(n >> 10) + " KiB";
  return std::to_string(n) + " bytes";
}

std::string Errno(int err) { return std::strerror(err); }

// Milliseconds to `deadline`, rounded up so that poll does not spin; 0 past it.
int MsLeft(Clock::time_point deadline) {
  const auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

// Waits until `fd` is ready for `events` or `deadline` passes: > 0 ready,
// 0 out of time, < 0 error (errno).
int WaitFor(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const int ms = MsLeft(deadline);
    if (ms == 0) return 0;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms);
    if (r < 0 && errno == EINTR) continue;
    if (r != 0) return r;
  }
}

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Socket& operator=(Socket&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

// A Status for a call that got no answer, and its kind.
Status Fail(HttpCallFailure kind, HttpCallFailure* out, std::string message) {
  *out = kind;
  return UnavailableError(std::move(message));
}

// One address: a connection within `timeout` (and the deadline), or why not.
Status ConnectOne(const addrinfo& ai, std::chrono::milliseconds timeout, Clock::time_point deadline,
                  Socket* out, HttpCallFailure* failure) {
  Socket s(::socket(ai.ai_family, ai.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai.ai_protocol));
  if (s.fd() < 0) return Fail(HttpCallFailure::kConnectFailed, failure, "socket: " + Errno(errno));
  if (::connect(s.fd(), ai.ai_addr, ai.ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      return Fail(HttpCallFailure::kConnectFailed, failure, "connect: " + Errno(errno));
    }
    const int r = WaitFor(s.fd(), POLLOUT, std::min(deadline, Clock::now() + timeout));
    if (r == 0) {
      return Fail(HttpCallFailure::kConnectTimeout, failure,
                  "connect timed out after " + std::to_string(timeout.count()) + " ms");
    }
    int err = 0;
    socklen_t len = sizeof(err);
    if (r < 0) err = errno;
    if (r > 0 && ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err != 0) return Fail(HttpCallFailure::kConnectFailed, failure, "connect: " + Errno(err));
  }
  const int one = 1;
  ::setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  *out = std::move(s);
  return Status::Ok();
}

// Each address of `host` in turn: the first connection made.
Status Connect(const HttpCallRequest& req, const HttpCallOptions& opts, Socket* out,
               HttpCallFailure* failure) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* list = nullptr;
  const std::string port = std::to_string(req.port);
  const int rc = ::getaddrinfo(req.host.c_str(), port.c_str(), &hints, &list);
  if (rc != 0) {
    return Fail(HttpCallFailure::kConnectFailed, failure,
                "cannot resolve '" + req.host + "': " + ::gai_strerror(rc));
  }
  Status last = Fail(HttpCallFailure::kConnectFailed, failure, "no address for " + req.host);
  bool timed_out = false;
  for (const addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    last = ConnectOne(*ai, opts.connect_timeout, opts.deadline, out, failure);
    if (last.ok()) break;
    timed_out = timed_out || *failure == HttpCallFailure::kConnectTimeout;
    if (MsLeft(opts.deadline) == 0) break;
  }
  ::freeaddrinfo(list);
  if (last.ok()) *failure = HttpCallFailure::kNone;
  if (!last.ok() && timed_out) *failure = HttpCallFailure::kConnectTimeout;
  return last;
}

bool HasLineBreak(std::string_view s) { return s.find_first_of("\r\n") != std::string_view::npos; }

Result<std::string> FormatRequest(const HttpCallRequest& req) {
  if (req.method.empty() || req.target.empty() || req.target.front() != '/' ||
      req.target.find_first_of(" \t\r\n") != std::string::npos) {
    return InvalidArgumentError("request not sent: bad method or target '" + req.target + "'");
  }
  const bool v6 = req.host.find(':') != std::string::npos;
  std::string out = req.method + " " + req.target + " HTTP/1.1\r\nHost: " + (v6 ? "[" : "") +
                    req.host + (v6 ? "]" : "") + ":" + std::to_string(req.port) +
                    "\r\nAccept: */*\r\nUser-Agent: kvbridge\r\nConnection: close\r\n";
  if (req.method != "GET" || !req.body.empty()) {
    out += "Content-Type: " + req.content_type +
           "\r\nContent-Length: " + std::to_string(req.body.size()) + "\r\n";
  }
  for (const auto& [name, value] : req.headers) {
    if (name.empty() || HasLineBreak(name) || HasLineBreak(value) ||
        name.find(':') != std::string::npos) {
      return InvalidArgumentError("request not sent: header '" + name.substr(0, 64) +
                                  "' has a line break or is malformed");
    }
    out += name + ": " + value + "\r\n";
  }
  return out + "\r\n" + req.body;
}

Status SendAll(int fd, std::string_view data, Clock::time_point deadline,
               HttpCallFailure* failure) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return Fail(HttpCallFailure::kSendFailed, failure, "send: " + Errno(errno));
    }
    const int r = WaitFor(fd, POLLOUT, deadline);
    if (r == 0) return Fail(HttpCallFailure::kSendFailed, failure, "send timed out");
    if (r < 0) return Fail(HttpCallFailure::kSendFailed, failure, "poll: " + Errno(errno));
  }
  return Status::Ok();
}

// The answer, parsed as it arrives; every callback checks its bound first.
class AnswerReader {
 public:
  enum class State { kMore, kDone, kBad };

  AnswerReader(const std::vector<std::string>& wanted, size_t max_body)
      : wanted_(wanted), max_body_(max_body) {
    http_parser_init(&parser_, HTTP_RESPONSE);
    parser_.data = this;
    http_parser_settings_init(&settings_);
    settings_.on_header_field = &AnswerReader::OnHeaderField;
    settings_.on_header_value = &AnswerReader::OnHeaderValue;
    settings_.on_headers_complete = &AnswerReader::OnHeadersComplete;
    settings_.on_body = &AnswerReader::OnBody;
    settings_.on_message_complete = &AnswerReader::OnMessageComplete;
  }

  // Parses `n` more bytes; n == 0: the connection closed.
  State Feed(const char* data, size_t n) {
    http_parser_execute(&parser_, &settings_, n == 0 ? nullptr : data, n);
    if (done_) return State::kDone;
    const auto err = static_cast<http_errno>(parser_.http_errno);
    if (err == HPE_OK) return State::kMore;
    if (error_.ok()) error_ = ParserError(err);
    return State::kBad;
  }
  const Status& error() const { return error_; }
  HttpAnswer Take() { return std::move(answer_); }

 private:
  static AnswerReader& Of(http_parser* p) { return *static_cast<AnswerReader*>(p->data); }

  Status ParserError(http_errno err) const {
    if (err == HPE_HEADER_OVERFLOW) {
      return ResourceExhaustedError("answered with a head (status line and headers) over " +
                                    Bytes(HTTP_MAX_HEADER_SIZE));
    }
    return InternalError(std::string("answered with a malformed HTTP response (") +
                         http_errno_name(err) + ": " + http_errno_description(err) + ")");
  }

  int Refuse(Status s) {
    error_ = std::move(s);
    return -1;
  }

  bool Kept(std::string_view name) const {
    if (EqualsIgnoreCase(name, "Content-Encoding")) return true;
    return std::any_of(wanted_.begin(), wanted_.end(),
                       [&](const std::string& w) { return EqualsIgnoreCase(name, w); });
  }

  // The header just read is complete: keep it when it is wanted.
  void EndHeader() {
    if (state_ == kValue && keep_)
      answer_.headers.emplace_back(std::move(field_), std::move(value_));
    field_.clear();
    value_.clear();
    state_ = kNone;
  }

  static int OnHeaderField(http_parser* p, const char* at, size_t n) {
    AnswerReader& r = Of(p);
    if (r.state_ != kField) {
      r.EndHeader();
      r.state_ = kField;
      if (++r.fields_ > kMaxAnswerHeaders) {
        return r.Refuse(ResourceExhaustedError(
            "answered with more than " + std::to_string(kMaxAnswerHeaders) + " header fields"));
      }
    }
    const size_t room = r.field_.size() <= kMaxFieldName ? kMaxFieldName + 1 - r.field_.size() : 0;
    r.field_.append(at, std::min(n, room));
    return 0;
  }

  static int OnHeaderValue(http_parser* p, const char* at, size_t n) {
    AnswerReader& r = Of(p);
    if (r.state_ != kValue) {
      r.state_ = kValue;
      // Trailers of a chunked body are not kept.
      r.keep_ = !r.head_done_ && r.field_.size() <= kMaxFieldName && r.Kept(r.field_);
    }
    if (!r.keep_) return 0;
    if (r.value_.size() + n > kMaxKeptHeaderValue) {
      return r.Refuse(ResourceExhaustedError("answered with a " + r.field_ + " header over " +
                                             Bytes(kMaxKeptHeaderValue)));
    }
    r.value_.append(at, n);
    return 0;
  }

  static int OnHeadersComplete(http_parser* p) {
    AnswerReader& r = Of(p);
    r.EndHeader();
    r.head_done_ = true;
    r.answer_.status = p->status_code;
    const std::string encoding = r.answer_.Header("Content-Encoding");
    if (!encoding.empty() && !EqualsIgnoreCase(encoding, "identity")) {
      return r.Refuse(InternalError("answered with Content-Encoding '" + encoding.substr(0, 64) +
                                    "' (only identity is read)"));
    }
    const bool chunked = (p->flags & F_CHUNKED) != 0;
    if (!chunked && p->content_length != ULLONG_MAX) {
      if (p->content_length > r.max_body_) {
        return r.Refuse(
            ResourceExhaustedError("answered with a body over " + Bytes(r.max_body_) +
                                   " (Content-Length: " + std::to_string(p->content_length) + ")"));
      }
      // What is declared may never come: reserve at most 1 MiB of it.
      r.answer_.body.reserve(static_cast<size_t>(std::min<uint64_t>(p->content_length, 1 << 20)));
    }
    return 0;
  }

  static int OnBody(http_parser* p, const char* at, size_t n) {
    AnswerReader& r = Of(p);
    if (n > r.max_body_ - r.answer_.body.size()) {
      const bool chunked = (p->flags & F_CHUNKED) != 0;
      return r.Refuse(ResourceExhaustedError(
          "answered with a body over " + Bytes(r.max_body_) +
          (chunked ? " (chunked)" : " (without a length, read to the close)")));
    }
    r.answer_.body.append(at, n);
    return 0;
  }

  static int OnMessageComplete(http_parser* p) {
    AnswerReader& r = Of(p);
    if (p->status_code / 100 == 1) {  // e.g. 100 Continue: the answer is yet to come
      if (++r.interim_ > kMaxInterimAnswers) {
        return r.Refuse(InternalError("answered with more than " +
                                      std::to_string(kMaxInterimAnswers) + " interim (1xx) heads"));
      }
      r.answer_ = HttpAnswer();
      r.fields_ = 0;
      r.head_done_ = false;
      return 0;
    }
    r.done_ = true;
    http_parser_pause(p, 1);  // bytes after the answer are not read
    return 0;
  }

  const std::vector<std::string>& wanted_;
  const size_t max_body_;
  http_parser parser_;
  http_parser_settings settings_;
  HttpAnswer answer_;
  std::string field_;                             // the header being read: its name (clipped) and,
  std::string value_;                             // when kept, its value
  enum { kNone, kField, kValue } state_ = kNone;  // of the header being read
  bool keep_ = false;
  bool head_done_ = false;
  size_t fields_ = 0;
  int interim_ = 0;
  bool done_ = false;
  Status error_;
};

// Reads until the answer is whole, refused, or the deadline passes.
Result<HttpAnswer> ReadAnswer(int fd, const HttpCallRequest& req, const HttpCallOptions& opts,
                              HttpCallFailure* failure) {
  AnswerReader reader(req.wanted_headers, opts.max_body);
  std::string buf(kReadChunk, '\0');
  for (;;) {
    const ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const int r = WaitFor(fd, POLLIN, opts.deadline);
      if (r == 0) return Fail(HttpCallFailure::kNoAnswer, failure, "no complete answer in time");
      if (r < 0) return Fail(HttpCallFailure::kNoAnswer, failure, "poll: " + Errno(errno));
      continue;
    }
    if (n < 0) return Fail(HttpCallFailure::kNoAnswer, failure, "recv: " + Errno(errno));
    const AnswerReader::State s = reader.Feed(buf.data(), static_cast<size_t>(n));
    if (s == AnswerReader::State::kDone) return reader.Take();
    if (n == 0) {
      return Fail(HttpCallFailure::kNoAnswer, failure,
                  "the connection closed before the answer was whole");
    }
    if (s == AnswerReader::State::kBad) {
      *failure = HttpCallFailure::kBadAnswer;
      return reader.error();
    }
    // An answer may come in any number of reads; the deadline bounds them.
    if (MsLeft(opts.deadline) == 0) {
      return Fail(HttpCallFailure::kNoAnswer, failure, "no complete answer in time");
    }
  }
}

}  // namespace

std::string HttpAnswer::Header(const std::string& name) const {
  for (const auto& [k, v] : headers) {
    if (EqualsIgnoreCase(k, name)) return v;
  }
  return "";
}

Result<HttpAnswer> HttpCall(const HttpCallRequest& request, const HttpCallOptions& options,
                            HttpCallFailure* failure) {
  HttpCallFailure ignored = HttpCallFailure::kNone;
  if (failure == nullptr) failure = &ignored;
  *failure = HttpCallFailure::kNone;
  Result<std::string> wire = FormatRequest(request);
  if (!wire.ok()) {
    *failure = HttpCallFailure::kBadRequest;
    return wire.status();
  }
  Socket sock;
  KVB_RETURN_IF_ERROR(Connect(request, options, &sock, failure));
  KVB_RETURN_IF_ERROR(SendAll(sock.fd(), *wire, options.deadline, failure));
  return ReadAnswer(sock.fd(), request, options, failure);
}

}  // namespace kvbridge::internal
