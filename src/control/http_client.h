// HttpCall: one bounded HTTP/1.1 request and its answer, on a connection of
// its own. Every byte a server sends may be hostile: a registry anyone can
// write to names the rank endpoints decode ranks read from. httplib 0.11.4's
// client (Debian's, a compiled library) reads a status or header line of any
// length and a chunked or close-delimited body to its end before any size
// check, so one such server made every decode rank allocate until the
// kernel killed it. Here the answer is parsed as it arrives (nodejs
// http-parser, sans-I/O) and the call stops at the first byte past a bound:
//
// - the head (status line and headers): http-parser's HTTP_MAX_HEADER_SIZE
//   (80 KiB), and at most kMaxAnswerHeaders header fields;
// - the body: `max_body` bytes, refused on a Content-Length above it before
//   any of the body is read, and on a chunked or close-delimited body as
//   soon as the running count passes it;
// - the time: each connect attempt `connect_timeout`, the whole call
//   (connect, send, every read) `deadline`, so a server that trickles a
//   byte at a time holds it no longer;
// - a body the connection closes before it is whole is no answer; any
//   Content-Encoding but identity is refused (none is asked for).
//
// Blocking from the caller's view, thread-safe (no shared state). The
// host's name is resolved with getaddrinfo, which the deadline does not
// bound (addresses kvbridge is given are mostly literals).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "kvbridge/status.h"

namespace kvbridge::internal {

// Header fields an answer may have.
inline constexpr size_t kMaxAnswerHeaders = 100;
// Bytes kept of the value of one header the caller asked for; a longer one
// is refused (the head's own bound is larger).
inline constexpr size_t kMaxKeptHeaderValue = 8 << 10;

struct HttpCallRequest {
  std::string host;  // a name or an IP literal (IPv6 without brackets)
  int port = 0;
  std::string method;  // "GET", "PUT", "POST", ...
  std::string target;  // path and query
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;  // sent with Content-Length (and a content type) unless GET with none
  std::string content_type = "application/json";
  // Answer headers to hand back (names compared without case).
  std::vector<std::string> wanted_headers;
};

struct HttpCallOptions {
  std::chrono::milliseconds connect_timeout{1000};  // each address tried
  std::chrono::steady_clock::time_point deadline;   // the whole call
  size_t max_body = 1 << 20;
};

struct HttpAnswer {
  int status = 0;
  std::string body;
  // Of the wanted headers, those the answer had, in its order.
  std::vector<std::pair<std::string, std::string>> headers;

  // The value of header `name` (without case), "" when it did not come.
  std::string Header(const std::string& name) const;
};

// Why a call has no usable answer.
enum class HttpCallFailure {
  kNone,
  kConnectTimeout,  // no connection within connect_timeout: nothing was sent
  kConnectFailed,   // refused, unreachable, or the name did not resolve
  kSendFailed,      // the request could not be sent whole
  kNoAnswer,        // closed, reset or out of time before a whole answer
  kBadAnswer,       // an answer came, but malformed or over a bound
  kBadRequest,      // the request cannot be sent as asked (a line break in a header): not sent
};

// True for the failures where no (complete) answer came from the server.
inline bool IsNoAnswer(HttpCallFailure f) {
  return f != HttpCallFailure::kNone && f != HttpCallFailure::kBadAnswer &&
         f != HttpCallFailure::kBadRequest;
}

// Sends `request` and reads its answer. On failure the Status says why
// (Unavailable when no answer came; ResourceExhausted for an answer over a
// bound, Internal for a malformed one, its message beginning "answered
// with"/"answered"), and `*failure` (may be null) which kind it was.
Result<HttpAnswer> HttpCall(const HttpCallRequest& request, const HttpCallOptions& options,
                            HttpCallFailure* failure = nullptr);

}  // namespace kvbridge::internal
