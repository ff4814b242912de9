// HttpCall against servers that write hostile bytes: each bound holds as
// soon as it is passed, the rest is not read (the server sees the client
// go), and a trickling server does not hold a call past its deadline.
#include "control/http_client.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "control/hostile_server_test_util.h"
#include "control/registry.h"

namespace kvbridge::internal {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using testing::HostilePeer;
using testing::HostileServer;
using testing::kFlood;
using testing::kMaxSentBeforeClose;

constexpr size_t kMiB = size_t{1} << 20;

HttpCallRequest Get(int port) {
  HttpCallRequest r;
  r.host = "127.0.0.1";
  r.port = port;
  r.method = "GET";
  r.target = "/kvbridge/rank_record";
  r.wanted_headers = {kRankCredentialHeader};
  return r;
}

HttpCallOptions Within(milliseconds timeout, size_t max_body = kMiB) {
  HttpCallOptions o;
  o.connect_timeout = milliseconds(1000);
  o.deadline = Clock::now() + timeout;
  o.max_body = max_body;
  return o;
}

struct Outcome {
  Result<HttpAnswer> answer;
  HttpCallFailure failure;
};

// Records what a hostile server got to send (in the test's XML output).
void RecordSent(const HostileServer& server) {
  ::testing::Test::RecordProperty("sent_bytes", std::to_string(server.sent()));
}

Outcome Call(int port, milliseconds timeout = milliseconds(5000), size_t max_body = kMiB) {
  HttpCallFailure failure = HttpCallFailure::kNone;
  Result<HttpAnswer> a = HttpCall(Get(port), Within(timeout, max_body), &failure);
  return Outcome{std::move(a), failure};
}

// Calls `server` and waits for it: the call is refused as over a bound
// (its message naming `says`), before the server got far.
void ExpectCutOff(HostileServer& server, const std::string& says) {
  Outcome o = Call(server.port());
  server.Join();
  RecordSent(server);
  ASSERT_FALSE(o.answer.ok());
  EXPECT_EQ(o.failure, HttpCallFailure::kBadAnswer) << o.answer.status().ToString();
  EXPECT_EQ(o.answer.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(o.answer.status().message().find(says), std::string::npos)
      << o.answer.status().message();
  EXPECT_LT(server.sent(), kMaxSentBeforeClose);
}

TEST(HttpClientHostileTest, AnEndlessStatusLineIsCutOffAtTheHeadBound) {
  HostileServer server([](HostilePeer& p) {
    if (p.Send("HTTP/1.1 200 OK")) p.SendFill(kFlood);
  });
  ExpectCutOff(server, "head");
}

TEST(HttpClientHostileTest, AnEndlessHeaderLineIsCutOffAtTheHeadBound) {
  HostileServer server(testing::EndlessHeaderLine());
  ExpectCutOff(server, "head");
}

TEST(HttpClientHostileTest, TooManyHeaderFieldsAreRefused) {
  HostileServer server([](HostilePeer& p) {
    std::string head = "HTTP/1.1 200 OK\r\n";
    for (int i = 0; i < 200; ++i) head += "X-" + std::to_string(i) + ": 1\r\n";
    p.Send(head + "Content-Length: 0\r\n\r\n");
  });
  Outcome o = Call(server.port());
  ASSERT_FALSE(o.answer.ok());
  EXPECT_EQ(o.failure, HttpCallFailure::kBadAnswer);
  EXPECT_NE(o.answer.status().message().find("more than 100 header fields"), std::string::npos)
      << o.answer.status().message();
}

TEST(HttpClientHostileTest, AnEndlessChunkedBodyStopsAtMaxBody) {
  HostileServer server(testing::EndlessChunkedBody());
  ExpectCutOff(server, "body over 1 MiB (chunked)");
}

TEST(HttpClientHostileTest, AnEndlessCloseDelimitedBodyStopsAtMaxBody) {
  HostileServer server([](HostilePeer& p) {
    if (p.Send("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")) p.SendFill(kFlood);
  });
  ExpectCutOff(server, "body over 1 MiB");
}

TEST(HttpClientHostileTest, AHugeContentLengthIsRefusedBeforeTheBody) {
  HostileServer server(testing::HugeContentLength());
  ExpectCutOff(server, "Content-Length: 10000000000");
}

TEST(HttpClientHostileTest, ATricklingServerDoesNotHoldTheCallPastItsDeadline) {
  HostileServer server(testing::Trickle());
  const auto start = Clock::now();
  Outcome o = Call(server.port(), milliseconds(500));
  const auto took = Clock::now() - start;
  server.Join();
  RecordSent(server);
  ASSERT_FALSE(o.answer.ok());
  EXPECT_EQ(o.failure, HttpCallFailure::kNoAnswer) << o.answer.status().ToString();
  EXPECT_TRUE(IsNoAnswer(o.failure));
  // Well short of the 30 s the server trickles for (the old client: 32.5 s),
  // with room for a sanitizer build on a loaded machine.
  EXPECT_LT(took, milliseconds(10000));
  EXPECT_LT(server.sent(), size_t{100});
}

TEST(HttpClientHostileTest, ABodyCutShortIsNoAnswer) {
  HostileServer server([](HostilePeer& p) {
    p.Send("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + std::string(50, 'x'));
    p.Close();
  });
  Outcome o = Call(server.port());
  ASSERT_FALSE(o.answer.ok());
  EXPECT_EQ(o.failure, HttpCallFailure::kNoAnswer) << o.answer.status().ToString();
  EXPECT_EQ(o.answer.status().code(), StatusCode::kUnavailable);
  // The same for a chunked body without its last chunk.
  HostileServer chunked([](HostilePeer& p) {
    p.Send("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n");
    p.Close();
  });
  o = Call(chunked.port());
  EXPECT_EQ(o.failure, HttpCallFailure::kNoAnswer) << o.answer.status().ToString();
}

TEST(HttpClientHostileTest, MalformedAndCompressedAnswersAreRefused) {
  HostileServer garbage([](HostilePeer& p) { p.Send("SSH-2.0-OpenSSH\r\n\r\n"); });
  Outcome o = Call(garbage.port());
  EXPECT_EQ(o.failure, HttpCallFailure::kBadAnswer) << o.answer.status().ToString();
  EXPECT_EQ(o.answer.status().code(), StatusCode::kInternal);
  HostileServer gzip([](HostilePeer& p) {
    p.Send("HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc");
  });
  o = Call(gzip.port());
  EXPECT_EQ(o.failure, HttpCallFailure::kBadAnswer);
  EXPECT_NE(o.answer.status().message().find("Content-Encoding 'gzip'"), std::string::npos)
      << o.answer.status().message();
}

TEST(HttpClientTest, AnswersWithALengthChunkedAndToTheCloseAreRead) {
  HostileServer length([](HostilePeer& p) {
    p.Send("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n" + std::string(kRankCredentialHeader) +
           ": secret-1\r\n\r\nhello");
  });
  Outcome o = Call(length.port());
  ASSERT_TRUE(o.answer.ok()) << o.answer.status().ToString();
  EXPECT_EQ(o.answer->status, 200);
  EXPECT_EQ(o.answer->body, "hello");
  EXPECT_EQ(o.answer->Header(kRankCredentialHeader), "secret-1");
  EXPECT_EQ(o.failure, HttpCallFailure::kNone);

  HostileServer chunked([](HostilePeer& p) {
    p.Send(
        "HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n"
        "3\r\n{\"a\r\n3;ext=1\r\n\":1\r\n1\r\n}\r\n0\r\nX-Trailer: t\r\n\r\n");
  });
  o = Call(chunked.port());
  ASSERT_TRUE(o.answer.ok()) << o.answer.status().ToString();
  EXPECT_EQ(o.answer->status, 503);
  EXPECT_EQ(o.answer->body, "{\"a\":1}");
  EXPECT_EQ(o.answer->Header(kRankCredentialHeader), "");

  HostileServer to_close([](HostilePeer& p) {
    p.Send("HTTP/1.0 200 OK\r\n\r\n" + std::string(kMiB, 'z'));
    p.Close();
  });
  o = Call(to_close.port());  // exactly max_body: taken
  ASSERT_TRUE(o.answer.ok()) << o.answer.status().ToString();
  EXPECT_EQ(o.answer->body.size(), kMiB);
}

TEST(HttpClientTest, AClosedPortIsNoAnswer) {
  // A port bound but not listening refuses connections, and stays this
  // test's while the socket is open (no other test can take it meanwhile).
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  Outcome o = Call(ntohs(a.sin_port));
  ::close(fd);
  ASSERT_FALSE(o.answer.ok());
  EXPECT_EQ(o.failure, HttpCallFailure::kConnectFailed) << o.answer.status().ToString();
  EXPECT_TRUE(IsNoAnswer(o.failure));
  EXPECT_EQ(o.answer.status().code(), StatusCode::kUnavailable);
}

TEST(HttpClientTest, AHeaderValueWithALineBreakIsNotSent) {
  // A header line break would let a value write headers of its own.
  HttpCallRequest bad = Get(1);
  bad.headers.emplace_back("X-A", "1\r\nX-B: 2");
  HttpCallFailure failure = HttpCallFailure::kNone;
  Result<HttpAnswer> a = HttpCall(bad, Within(milliseconds(1000)), &failure);
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument) << a.status().ToString();
  EXPECT_EQ(failure, HttpCallFailure::kBadRequest);
  EXPECT_FALSE(IsNoAnswer(failure));
}

}  // namespace
}  // namespace kvbridge::internal
