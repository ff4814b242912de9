// The front's request framer without a socket: which requests pass whole,
// which are refused, with which status, and how much it buffers before it
// refuses.
#include "control/http_front.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvbridge::internal {
namespace {

using Event = HttpRequestFramer::Event;

HttpFrontLimits Limits() {
  HttpFrontLimits l;
  l.max_line_bytes = 8 << 10;
  l.max_head_bytes = 64 << 10;
  l.max_headers = 100;
  l.max_body_bytes = 1024;
  return l;
}

std::string ManyHeaders(int n, size_t value_bytes) {
  std::string h;
  for (int i = 0; i < n; ++i)
    h += "X-" + std::to_string(i) + ": " + std::string(value_bytes, 'v') + "\r\n";
  return h;
}

struct RefusalCase {
  const char* name;
  std::string input;
  int http_status;
  StatusCode code;
  const char* part;  // of the message
};

TEST(HttpRequestFramer, RefusesWhatBreaksABoundWithItsStatus) {
  const std::string get = "GET /health HTTP/1.1\r\n";
  const std::string post = "POST /x HTTP/1.1\r\n";
  const std::vector<RefusalCase> cases = {
      {"long request line, unfinished", "GET /" + std::string(9000, 'a'), 414,
       StatusCode::kInvalidArgument, "request line is longer than 8192 bytes"},
      {"long header line, unfinished", get + "X: " + std::string(9000, 'a'), 431,
       StatusCode::kResourceExhausted, "a header line may have at most 8192 bytes"},
      {"head over 64 KiB", get + ManyHeaders(9, 8000), 431, StatusCode::kResourceExhausted,
       "request head"},
      {"101 header fields", get + ManyHeaders(101, 1) + "\r\n", 431, StatusCode::kResourceExhausted,
       "more than 100 header fields"},
      {"chunked, before the head ends", post + "Transfer-Encoding: chunked\r\n", 411,
       StatusCode::kInvalidArgument, "chunked is not accepted"},
      {"chunked among other codings", post + "transfer-encoding: gzip, Chunked\r\n", 411,
       StatusCode::kInvalidArgument, "chunked"},
      {"another transfer coding", post + "Transfer-Encoding: gzip\r\n", 501,
       StatusCode::kUnimplemented, "Transfer-Encoding"},
      {"body over the limit", post + "Content-Length: 1025\r\n", 413,
       StatusCode::kResourceExhausted, "limit of 1024 bytes"},
      {"body beyond 64 bits", post + "Content-Length: 99999999999999999999999\r\n", 413,
       StatusCode::kResourceExhausted, "limit"},
      {"length not a number", post + "Content-Length: 1e3\r\n", 400, StatusCode::kInvalidArgument,
       "Content-Length"},
      {"negative length", post + "Content-Length: -1\r\n", 400, StatusCode::kInvalidArgument,
       "Content-Length"},
      {"two lengths", post + "Content-Length: 5\r\nContent-Length: 6\r\n", 400,
       StatusCode::kInvalidArgument, "conflicting"},
      {"bare LF", "GET / HTTP/1.1\n", 400, StatusCode::kInvalidArgument, "CRLF"},
      {"no version", "GET /\r\n", 400, StatusCode::kInvalidArgument, "request line"},
      {"two spaces", "GET  / HTTP/1.1\r\n", 400, StatusCode::kInvalidArgument, "request line"},
      {"HTTP/2 text", "GET / HTTP/2.0\r\n", 400, StatusCode::kInvalidArgument, "request line"},
      {"folded header", get + "X: a\r\n b\r\n", 400, StatusCode::kInvalidArgument, "header line"},
      {"header without colon", get + "X a\r\n", 400, StatusCode::kInvalidArgument, "header line"},
      {"space before colon", get + "X : a\r\n", 400, StatusCode::kInvalidArgument, "header line"},
      {"empty lines only", "\r\n\r\n\r\n\r\n\r\n", 400, StatusCode::kInvalidArgument,
       "empty lines"},
      // httplib inflates these without bound (review finding, session 36).
      {"gzip body", post + "Content-Encoding: gzip\r\nContent-Length: 1\r\n", 415,
       StatusCode::kInvalidArgument, "Content-Encoding 'gzip' is not accepted"},
      {"deflate body", post + "content-encoding: Deflate\r\n", 415, StatusCode::kInvalidArgument,
       "uncompressed"},
      {"brotli body", post + "Content-Encoding: br\r\n", 415, StatusCode::kInvalidArgument,
       "uncompressed"},
  };
  for (const RefusalCase& c : cases) {
    HttpRequestFramer f(Limits());
    f.Feed(c.input);
    ASSERT_EQ(f.Next(), Event::kRefused) << c.name;
    EXPECT_EQ(f.Next(), Event::kRefused) << c.name;  // stays refused
    EXPECT_EQ(f.refusal().http_status, c.http_status) << c.name;
    EXPECT_EQ(f.refusal().status.code(), c.code) << c.name;
    EXPECT_NE(f.refusal().status.message().find(c.part), std::string::npos)
        << c.name << ": " << f.refusal().status.message();
  }
}

// "identity" is no compression: taken.
TEST(HttpRequestFramer, AnIdentityContentEncodingIsTaken) {
  HttpRequestFramer f(Limits());
  f.Feed("POST /x HTTP/1.1\r\nContent-Encoding: identity\r\nContent-Length: 2\r\n\r\n{}");
  ASSERT_EQ(f.Next(), Event::kRequest);
  EXPECT_NE(f.TakeRequest().find("{}"), std::string::npos);
}

// The front drops the body of a request refused for its size (up to a
// bound) so that the client reads the 413 instead of a reset.
TEST(HttpRequestFramer, ABodyRefusedForItsSizeIsStillDeclared) {
  HttpRequestFramer f(Limits());
  f.Feed("PUT /route HTTP/1.1\r\nContent-Length: 3145728\r\n\r\n");
  ASSERT_EQ(f.Next(), Event::kRefused);
  EXPECT_EQ(f.refusal().http_status, 413);
  EXPECT_EQ(f.declared_body(), 3145728u);
}

// The defect: httplib grew a line by one byte at a time without a cap. The
// framer refuses an endless line once it passes the limit, whatever the
// size of the reads.
TEST(HttpRequestFramer, AnEndlessLineIsRefusedWithinTheLineLimit) {
  for (size_t read : {size_t{1}, size_t{100}, size_t{16} << 10}) {
    HttpRequestFramer f(Limits());
    f.Feed("GET /health HTTP/1.1\r\nX: ");
    size_t fed = 0;
    while (f.Next() == Event::kNeedMore && fed < (size_t{64} << 20)) {
      f.Feed(std::string(read, 'a'));
      fed += read;
    }
    EXPECT_EQ(f.Next(), Event::kRefused) << read;
    EXPECT_EQ(f.refusal().http_status, 431) << read;
    EXPECT_LE(fed, (size_t{8} << 10) + read) << read;
  }
}

TEST(HttpRequestFramer, PipelinedRequestsComeOutWholeAndInOrder) {
  const std::string first = "PUT /route HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello";
  const std::string second = "GET /health HTTP/1.1\r\nHost: a\r\n\r\n";
  const std::string third = "POST /x HTTP/1.1\r\nContent-Length: 0\r\n\r\n";
  const std::string all = first + second + third;
  // All at once, and one byte at a time.
  for (size_t step : {all.size(), size_t{1}}) {
    HttpRequestFramer f(Limits());
    std::vector<std::string> out;
    for (size_t at = 0; at < all.size(); at += step) {
      f.Feed(all.substr(at, step));
      while (f.Next() == Event::kRequest) out.push_back(f.TakeRequest());
    }
    EXPECT_EQ(out, (std::vector<std::string>{first, second, third})) << step;
    EXPECT_TRUE(f.idle());
  }
}

TEST(HttpRequestFramer, WaitsForTheWholeBodyAndNotBeyond) {
  HttpRequestFramer f(Limits());
  const std::string head = "POST /x HTTP/1.1\r\ncontent-length: 1024\r\n\r\n";
  f.Feed(head);
  EXPECT_EQ(f.Next(), Event::kNeedMore);
  EXPECT_FALSE(f.idle());
  EXPECT_EQ(f.declared_body(), 1024u);
  f.Feed(std::string(1023, 'b'));
  EXPECT_EQ(f.Next(), Event::kNeedMore);
  f.Feed("bGET");
  ASSERT_EQ(f.Next(), Event::kRequest);
  const std::string request = f.TakeRequest();
  EXPECT_EQ(request, head + std::string(1024, 'b'));
  EXPECT_EQ(f.Next(), Event::kNeedMore);  // "GET" of the next one
  EXPECT_FALSE(f.idle());
}

TEST(HttpRequestFramer, AnswersExpectContinueItselfAndHidesItFromHttplib) {
  HttpRequestFramer f(Limits());
  f.Feed("PUT /route HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n");
  EXPECT_EQ(f.Next(), Event::kNeedMore);
  EXPECT_TRUE(f.TakeContinue());
  EXPECT_FALSE(f.TakeContinue());  // once
  f.Feed("{}");
  ASSERT_EQ(f.Next(), Event::kRequest);
  EXPECT_EQ(f.TakeRequest(), "PUT /route HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}");
}

// httplib would build one copy of the answer per range asked for.
TEST(HttpRequestFramer, LeavesRangeOutSoEveryAnswerIsWhole) {
  HttpRequestFramer f(Limits());
  f.Feed(
      "GET /route HTTP/1.1\r\nRange: bytes=0-,0-,0-\r\nHost: x\r\nrange: bytes=1-2\r\n"
      "If-Range: \"x\"\r\n\r\n");
  ASSERT_EQ(f.Next(), Event::kRequest);
  EXPECT_EQ(f.TakeRequest(), "GET /route HTTP/1.1\r\nHost: x\r\n\r\n");
}

TEST(HttpRequestFramer, ToleratesAnEmptyLineBeforeARequest) {
  HttpRequestFramer f(Limits());
  f.Feed("\r\nGET / HTTP/1.0\r\n\r\n");
  ASSERT_EQ(f.Next(), Event::kRequest);
  EXPECT_EQ(f.TakeRequest(), "GET / HTTP/1.0\r\n\r\n");
}

TEST(HttpRequestFramer, RefusalResponseIsAClosingJsonError) {
  HttpRefusal r{431, ResourceExhaustedError("too many")};
  const std::string answer = RefusalResponse(r);
  EXPECT_EQ(answer.rfind("HTTP/1.1 431 Request Header Fields Too Large\r\n", 0), 0u) << answer;
  EXPECT_NE(answer.find("Connection: close\r\n"), std::string::npos) << answer;
  EXPECT_NE(answer.find("\r\n\r\n{\"error\":\"RESOURCE_EXHAUSTED\",\"message\":\"too many\"}"),
            std::string::npos)
      << answer;
}

}  // namespace
}  // namespace kvbridge::internal
