#include "control/http_front.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>

#include "control/http_status.h"
#include "control/json_fields.h"

namespace kvbridge::internal {
namespace {

// Empty lines a client may send before a request line (RFC 9112 2.2: a
// server SHOULD ignore at least one).
constexpr size_t kMaxBlankLines = 4;

bool IsTokenChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool IsToken(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), IsTokenChar);
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

bool ContainsIgnoreCase(std::string_view text, std::string_view word) {
  if (word.size() > text.size()) return false;
  for (size_t i = 0; i + word.size() <= text.size(); ++i) {
    if (EqualsIgnoreCase(text.substr(i, word.size()), word)) return true;
  }
  return false;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

const char* ReasonPhrase(int http_status) {
  switch (http_status) {
    case 400:
      return "Bad Request";
    case 408:
      return "Request Timeout";
    case 411:
      return "Length Required";
    case 413:
      return "Payload Too Large";
    case 414:
      return "URI Too Long";
    case 415:
      return "Unsupported Media Type";
    case 431:
      return "Request Header Fields Too Large";
    case 501:
      return "Not Implemented";
    default:
      return "Error";
  }
}

}  // namespace

HttpRequestFramer::Event HttpRequestFramer::Next() {
  if (refused_) return Event::kRefused;
  while (head_end_ == std::string::npos) {
    const size_t nl = buffer_.find('\n', line_begin_);
    const size_t end = nl == std::string::npos ? buffer_.size() : nl + 1;
    // A line still being read may end in '\r' and then '\n'.
    const size_t content = end - line_begin_ - (nl == std::string::npos ? 0 : 1);
    if (content > limits_.max_line_bytes + 1) {
      if (lines_ == 0) {
        return Refuse(414, InvalidArgumentError("request line is longer than " +
                                                std::to_string(limits_.max_line_bytes) + " bytes"));
      }
      return Refuse(431, ResourceExhaustedError(
                             "header line longer than allowed: a header line may have at most " +
                             std::to_string(limits_.max_line_bytes) + " bytes"));
    }
    if (end > limits_.max_head_bytes) {
      return Refuse(431, ResourceExhaustedError("request head (request line and headers) longer "
                                                "than the limit of " +
                                                std::to_string(limits_.max_head_bytes) + " bytes"));
    }
    if (nl == std::string::npos) return Event::kNeedMore;
    if (nl == line_begin_ || buffer_[nl - 1] != '\r') {
      return Refuse(400, InvalidArgumentError("a request line or header line does not end "
                                              "with CRLF"));
    }
    const std::string_view line(buffer_.data() + line_begin_, nl - 1 - line_begin_);
    if (Event e = ParseLine(line, end); e != Event::kNeedMore) return e;
  }
  if (buffer_.size() < head_end_ + body_bytes_) return Event::kNeedMore;
  return Event::kRequest;
}

HttpRequestFramer::Event HttpRequestFramer::ParseLine(std::string_view line, size_t end) {
  if (lines_ == 0 && line.empty()) {
    // Tolerated before a request line; dropped so that the request begins
    // the buffer.
    if (++blank_lines_ > kMaxBlankLines) {
      return Refuse(400, InvalidArgumentError("empty lines instead of a request line"));
    }
    buffer_.erase(0, end);
    line_begin_ = 0;
    return Event::kNeedMore;
  }
  const size_t begin = line_begin_;
  line_begin_ = end;
  if (lines_++ == 0) return ParseRequestLine(line);
  if (line.empty()) {
    head_end_ = end;
    return Event::kNeedMore;
  }
  if (lines_ - 1 > limits_.max_headers) {
    return Refuse(431, ResourceExhaustedError("more than " + std::to_string(limits_.max_headers) +
                                              " header fields in one request"));
  }
  return ParseHeader(line, begin, end);
}

HttpRequestFramer::Event HttpRequestFramer::ParseRequestLine(std::string_view line) {
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  const bool ok = sp2 != std::string_view::npos && IsToken(line.substr(0, sp1)) && sp2 > sp1 + 1 &&
                  line.find(' ', sp2 + 1) == std::string_view::npos &&
                  (line.substr(sp2 + 1) == "HTTP/1.1" || line.substr(sp2 + 1) == "HTTP/1.0");
  if (!ok) {
    return Refuse(400, InvalidArgumentError("malformed request line (want METHOD SP target SP "
                                            "HTTP/1.1)"));
  }
  return Event::kNeedMore;
}

HttpRequestFramer::Event HttpRequestFramer::ParseHeader(std::string_view line, size_t begin,
                                                        size_t end) {
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos || !IsToken(line.substr(0, colon))) {
    // Also a folded line (one that begins with a space): obsolete, refused.
    return Refuse(400, InvalidArgumentError("malformed header line (want name: value)"));
  }
  const std::string_view name = line.substr(0, colon);
  const std::string_view value = Trim(line.substr(colon + 1));
  if (EqualsIgnoreCase(name, "Transfer-Encoding")) {
    if (ContainsIgnoreCase(value, "chunked")) {
      return Refuse(411, InvalidArgumentError("Transfer-Encoding: chunked is not accepted; send "
                                              "the body with a Content-Length"));
    }
    return Refuse(501, UnimplementedError("Transfer-Encoding is not accepted; send the body "
                                          "with a Content-Length"));
  }
  // httplib inflates a gzip, deflate or brotli body as it reads it, bounded
  // by nothing: a 1 MiB body within the limit grew to about 1 GiB (review
  // finding). No client of these servers compresses: refused.
  if (EqualsIgnoreCase(name, "Content-Encoding") && !EqualsIgnoreCase(value, "identity")) {
    return Refuse(415,
                  InvalidArgumentError("Content-Encoding '" + std::string(value.substr(0, 40)) +
                                       "' is not accepted; send the body uncompressed"));
  }
  if (EqualsIgnoreCase(name, "Content-Length")) {
    uint64_t n = 0;
    auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    const bool digits = !value.empty() && ptr == value.data() + value.size() &&
                        std::isdigit(static_cast<unsigned char>(value.front())) != 0;
    if (ec == std::errc::result_out_of_range || (digits && n > limits_.max_body_bytes)) {
      // Declared, for the drain after the refusal (see declared_body()).
      body_bytes_ = ec == std::errc() ? static_cast<size_t>(n) : SIZE_MAX;
      return Refuse(413, ResourceExhaustedError("request body of " + std::string(value) +
                                                " bytes is larger than the limit of " +
                                                std::to_string(limits_.max_body_bytes) + " bytes"));
    }
    if (!digits || ec != std::errc() || (has_length_ && n != body_bytes_)) {
      return Refuse(400, InvalidArgumentError("invalid or conflicting Content-Length"));
    }
    has_length_ = true;
    body_bytes_ = static_cast<size_t>(n);
  }
  if (EqualsIgnoreCase(name, "Expect") && EqualsIgnoreCase(value, "100-continue")) {
    expect_continue_ = true;
    dropped_.emplace_back(begin, end);
  }
  // httplib answers a Range with one copy of the body per range, as many as
  // asked, built in memory: 2,695 ranges in one 8 KiB line made a 6 KB
  // open GET /route answer 17 MB (hostile-input audit). A server may ignore
  // Range (RFC 9110, 14.2): left out, the whole answer goes once.
  if (EqualsIgnoreCase(name, "Range") || EqualsIgnoreCase(name, "If-Range"))
    dropped_.emplace_back(begin, end);
  return Event::kNeedMore;
}

HttpRequestFramer::Event HttpRequestFramer::Refuse(int http_status, Status status) {
  refused_ = true;
  refusal_.http_status = http_status;
  refusal_.status = std::move(status);
  return Event::kRefused;
}

bool HttpRequestFramer::TakeContinue() {
  if (!expect_continue_ || continue_sent_ || head_end_ == std::string::npos || refused_ ||
      body_bytes_ == 0 || buffer_.size() >= head_end_ + body_bytes_) {
    return false;
  }
  continue_sent_ = true;
  return true;
}

std::string HttpRequestFramer::TakeRequest() {
  const size_t size = head_end_ + body_bytes_;
  std::string request;
  request.reserve(size);
  size_t from = 0;
  for (const auto& [begin, end] : dropped_) {
    request.append(buffer_, from, begin - from);
    from = end;
  }
  request.append(buffer_, from, size - from);
  buffer_.erase(0, size);
  Reset();
  return request;
}

void HttpRequestFramer::Reset() {
  line_begin_ = 0;
  lines_ = 0;
  blank_lines_ = 0;
  head_end_ = std::string::npos;
  body_bytes_ = 0;
  has_length_ = false;
  expect_continue_ = false;
  continue_sent_ = false;
  dropped_.clear();
}

std::string RefusalResponse(const HttpRefusal& refusal) {
  const std::string body = DumpJson(ErrorBody(refusal.status));
  return "HTTP/1.1 " + std::to_string(refusal.http_status) + " " +
         ReasonPhrase(refusal.http_status) +
         "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

}  // namespace kvbridge::internal
