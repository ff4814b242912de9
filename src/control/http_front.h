// HttpRequestFramer: the bounded reading of HTTP/1.1 requests in front of
// httplib (HttpServerThread). httplib 0.11.4 reads a request line or header
// line of any length (its limit is checked after the whole line is in
// memory), a chunked body or a body without a length to its end, and a
// POST's body before routing, so one stranger can make the process allocate
// until it is killed. The framer reads what a client sends, one request
// after the other (keep-alive, pipelining), and hands on a request only
// once it is whole and within the limits; httplib then parses bytes that
// are already bounded, from memory.
//
// Sans-I/O: bytes in (Feed), events out (Next); no socket, clock or thread.
// Not thread-safe: one framer per connection.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvbridge/status.h"

namespace kvbridge::internal {

struct HttpFrontLimits {
  // Bytes of the request line or of one header line, CRLF not counted:
  // 414 (request line) or 431 (header line) beyond.
  size_t max_line_bytes = 8 << 10;
  // Bytes of the request line and every header line together: 431 beyond.
  size_t max_head_bytes = 64 << 10;
  // Header fields of one request: 431 beyond.
  size_t max_headers = 100;
  // A Content-Length above this is refused (413) before any of the body
  // is read. A body needs a Content-Length: any Transfer-Encoding is refused.
  size_t max_body_bytes = 1 << 10;
};

// Why a request was refused: the HTTP status to answer and the Status whose
// code and message make the JSON body. The connection is closed after it.
struct HttpRefusal {
  int http_status = 400;  // 400, 411, 413, 414, 415, 431 or 501
  Status status;
};

class HttpRequestFramer {
 public:
  enum class Event {
    kNeedMore,  // feed more bytes
    kRequest,   // a whole request is buffered: TakeRequest()
    kRefused,   // refusal() says why; feed nothing more
  };

  explicit HttpRequestFramer(HttpFrontLimits limits) : limits_(limits) {}

  // Appends bytes read from the client. The caller reads only while Next()
  // says kNeedMore, so the buffer stays within the head and body limits
  // plus one read.
  void Feed(std::string_view bytes) { buffer_.append(bytes); }

  // Parses what was fed so far; cheap to call again.
  Event Next();

  // The request's bytes (its head, then exactly its body), removed from the
  // buffer; what follows it (a pipelined request) stays. Expect:
  // 100-continue lines are left out (the front answers them, see
  // TakeContinue), and Range and If-Range lines (every answer is whole).
  // Precondition: Next() returned kRequest.
  std::string TakeRequest();

  // True once, when the head asked for 100-continue and its body has yet
  // to arrive: the caller then writes "HTTP/1.1 100 Continue".
  bool TakeContinue();

  const HttpRefusal& refusal() const { return refusal_; }
  // The Content-Length of the request being read, also of one refused for
  // it (SIZE_MAX past 64 bits); 0 when none (yet).
  size_t declared_body() const { return body_bytes_; }
  // No byte of a next request buffered: the connection is between requests.
  bool idle() const { return buffer_.empty(); }

 private:
  Event ParseLine(std::string_view line, size_t end);
  Event ParseRequestLine(std::string_view line);
  Event ParseHeader(std::string_view line, size_t begin, size_t end);
  Event Refuse(int http_status, Status status);
  void Reset();

  const HttpFrontLimits limits_;
  std::string buffer_;
  size_t line_begin_ = 0;                // where the line being read begins
  size_t lines_ = 0;                     // of this head, the request line included
  size_t blank_lines_ = 0;               // skipped before a request line
  size_t head_end_ = std::string::npos;  // after the blank line, once read
  size_t body_bytes_ = 0;
  bool has_length_ = false;
  bool expect_continue_ = false;
  bool continue_sent_ = false;
  std::vector<std::pair<size_t, size_t>> dropped_;  // Expect, Range lines: [begin, end)
  bool refused_ = false;
  HttpRefusal refusal_;
};

// The bytes of a complete answer for `refusal`: status line, a JSON body
// {"error": ..., "message": ...} and "Connection: close".
std::string RefusalResponse(const HttpRefusal& refusal);

}  // namespace kvbridge::internal
