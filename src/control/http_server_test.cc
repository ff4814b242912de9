// The servers behind HttpServerThread's front, on real sockets (127.0.0.1
// only): a stranger who sends without end is cut off after a bounded number
// of bytes, and honest clients keep keep-alive, pipelining and
// 100-continue. Before the front, httplib read an endless header line or
// chunked body into memory until the process was killed.
#include "control/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "control/auth.h"
#include "control/bootstrap_client.h"
#include "control/rank_endpoint.h"
#include "kvbridge/bootstrap.h"

namespace kvbridge::internal {
namespace {

using std::chrono::milliseconds;

constexpr size_t kEndless = size_t{64} << 20;  // what the stranger would send
// What it may get to send before the server answers or closes: the line or
// head limit, the bounded drain after a refusal (1 MiB) and what the two
// kernels buffer.
constexpr size_t kMaxSentBeforeClose = size_t{4} << 20;

// A connected socket to 127.0.0.1:port with small send buffers (so that
// what it "sent" is close to what the server read) and a receive timeout
// that bounds every read of the test.
int Connect(int port, int recv_timeout_s = 20) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int sndbuf = 64 << 10;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
  timeval tv{recv_timeout_s, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& data) {
  size_t at = 0;
  while (at < data.size()) {
    ssize_t n = send(fd, data.data() + at, data.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return false;
    at += static_cast<size_t>(n);
  }
  return true;
}

// Everything the server sends until it closes (or the receive timeout).
std::string ReadToClose(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

// One response from `fd` (head and Content-Length body), taken off the
// front of `*pending`, reading more as needed; "" on close or timeout.
std::string ReadResponse(int fd, std::string* pending) {
  char buf[4096];
  for (;;) {
    const size_t head_end = pending->find("\r\n\r\n");
    if (head_end != std::string::npos) {
      size_t length = 0;
      const size_t at = pending->find("Content-Length: ");
      if (at != std::string::npos && at < head_end) length = std::stoul(pending->substr(at + 16));
      if (pending->size() >= head_end + 4 + length) {
        std::string response = pending->substr(0, head_end + 4 + length);
        pending->erase(0, response.size());
        return response;
      }
    }
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return "";
    pending->append(buf, static_cast<size_t>(n));
  }
}

struct Flood {
  size_t sent = 0;     // bytes of the request the server let in
  std::string answer;  // what the server answered before it closed
};

// Sends `head` and then `filler` again and again, up to kEndless bytes, from
// a thread of its own, while this one reads the answer.
Flood SendEndless(int port, const std::string& head, const std::string& filler) {
  Flood flood;
  const int fd = Connect(port);
  EXPECT_GE(fd, 0);
  if (fd < 0) return flood;
  std::atomic<size_t> sent{0};
  std::thread writer([&] {
    if (!SendAll(fd, head)) return;
    sent += head.size();
    while (sent < kEndless && SendAll(fd, filler)) sent += filler.size();
    shutdown(fd, SHUT_WR);
  });
  flood.answer = ReadToClose(fd);
  writer.join();
  close(fd);
  flood.sent = sent;
  return flood;
}

void ExpectCutOff(const Flood& flood, const std::string& status) {
  EXPECT_LT(flood.sent, kMaxSentBeforeClose) << "the server read " << flood.sent << " bytes";
  // It answers before it closes (the client may miss it when its own send
  // fails first); when it does, with the status and a JSON reason.
  if (!flood.answer.empty()) {
    EXPECT_EQ(flood.answer.rfind("HTTP/1.1 " + status, 0), 0u) << flood.answer.substr(0, 200);
    EXPECT_NE(flood.answer.find("{\"error\":"), std::string::npos) << flood.answer;
  }
}

class HttpFrontTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BootstrapServerOptions o;
    o.port = 0;
    Result<std::unique_ptr<BootstrapServer>> server = BootstrapServer::Start(o);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    client_ =
        BootstrapClient::Create(server_->address(), milliseconds(5000), AuthTokenFromEnvironment())
            .value();
  }

  std::unique_ptr<BootstrapServer> server_;
  std::unique_ptr<BootstrapClient> client_;
};

// An endless header line: httplib read it byte by byte into one string.
TEST_F(HttpFrontTest, AnEndlessHeaderLineIsCutOffEarly) {
  Flood flood = SendEndless(server_->port(),
                            "GET /health HTTP/1.1\r\nHost: a\r\nX: ", std::string(64 << 10, 'a'));
  ExpectCutOff(flood, "431");
  EXPECT_TRUE(client_->Health().ok());
}

// An endless chunked body to an open route: httplib read the whole body
// before routing, whatever its payload limit.
TEST_F(HttpFrontTest, AnEndlessChunkedPostIsRefusedBeforeItsBody) {
  const std::string chunk = "1000\r\n" + std::string(0x1000, 'c') + "\r\n";
  std::string filler;
  while (filler.size() < (64 << 10)) filler += chunk;
  Flood flood = SendEndless(
      server_->port(),
      "POST /query_dp_ranks HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", filler);
  ExpectCutOff(flood, "411");
  EXPECT_TRUE(client_->Health().ok());
}

// The prefill rank's own endpoint: a stranger's chunked POST to a path that
// does not exist was read whole too, in the GPU process.
TEST(HttpFrontRankEndpointTest, AnEndlessChunkedPostToAnUnknownPathIsRefused) {
  Result<std::unique_ptr<RankEndpoint>> endpoint = RankEndpoint::Start("127.0.0.1");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
  (*endpoint)->SetRecord(R"({"role":"prefill"})");
  const std::string chunk = "1000\r\n" + std::string(0x1000, 'c') + "\r\n";
  std::string filler;
  while (filler.size() < (64 << 10)) filler += chunk;
  Flood flood = SendEndless(
      (*endpoint)->port(),
      "POST /nowhere HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", filler);
  ExpectCutOff(flood, "411");
  // A body with no length at all is no body: the bytes after the head are
  // the next request, which is garbage, refused the same way.
  flood = SendEndless((*endpoint)->port(), "POST /nowhere HTTP/1.1\r\nHost: a\r\n\r\n",
                      std::string(64 << 10, 'z'));
  EXPECT_LT(flood.sent, kMaxSentBeforeClose);
  EXPECT_EQ(flood.answer.rfind("HTTP/1.1 404", 0), 0u) << flood.answer.substr(0, 200);

  httplib::Client cli("127.0.0.1", (*endpoint)->port());
  httplib::Result res = cli.Get(kRankEndpointPath);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, R"({"role":"prefill"})");
}

// A Content-Length over the limit is answered from the head: httplib waited
// for (and dropped) the whole declared body first, holding a thread.
TEST(HttpFrontRankEndpointTest, AnOversizedBodyIsRefusedBeforeItIsSent) {
  Result<std::unique_ptr<RankEndpoint>> endpoint = RankEndpoint::Start("127.0.0.1");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
  const int fd = Connect((*endpoint)->port(), /*recv_timeout_s=*/3);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(
      SendAll(fd, "POST /kvbridge/rank HTTP/1.1\r\nHost: a\r\nContent-Length: 100000000\r\n\r\n"));
  const std::string answer = ReadToClose(fd);
  close(fd);
  EXPECT_EQ(answer.rfind("HTTP/1.1 413", 0), 0u) << answer;
  EXPECT_NE(answer.find("RESOURCE_EXHAUSTED"), std::string::npos) << answer;
}

// Keep-alive as before. Pipelining is new: httplib alone read each request
// through a stream of its own with a 4 KiB read buffer, so the bytes of a
// next request that came in the same read were dropped with it, and the
// connection sat idle until the keep-alive timeout closed it.
TEST_F(HttpFrontTest, KeepAliveAndPipeliningWork) {
  const int fd = Connect(server_->port());
  ASSERT_GE(fd, 0);
  const std::string health = "GET /health HTTP/1.1\r\nHost: a\r\n\r\n";
  std::string pending;
  for (int i = 0; i < 2; ++i) {  // one after the other on one connection
    ASSERT_TRUE(SendAll(fd, health));
    const std::string response = ReadResponse(fd, &pending);
    EXPECT_EQ(response.rfind("HTTP/1.1 200", 0), 0u) << i << ": " << response;
  }
  // Two at once, and a third with a body in the same write.
  const std::string unauthorized =
      "PUT /heartbeat HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}";
  ASSERT_TRUE(SendAll(fd, health + unauthorized + health));
  EXPECT_EQ(ReadResponse(fd, &pending).rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_EQ(ReadResponse(fd, &pending).rfind("HTTP/1.1 401", 0), 0u);
  // httplib's keep-alive count (5) closes the connection after the fifth.
  const std::string last = ReadResponse(fd, &pending);
  EXPECT_EQ(last.rfind("HTTP/1.1 200", 0), 0u) << last;
  EXPECT_NE(last.find("Connection: close"), std::string::npos) << last;
  EXPECT_EQ(ReadToClose(fd), "");
  close(fd);
}

TEST_F(HttpFrontTest, ExpectContinueIsAnsweredBeforeTheBody) {
  const int fd = Connect(server_->port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd,
                      "PUT /heartbeat HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n"
                      "Content-Length: 2\r\n\r\n"));
  std::string pending;
  EXPECT_EQ(ReadResponse(fd, &pending), "HTTP/1.1 100 Continue\r\n\r\n");
  ASSERT_TRUE(SendAll(fd, "{}"));
  const std::string response = ReadResponse(fd, &pending);
  EXPECT_EQ(response.rfind("HTTP/1.1 401", 0), 0u) << response;  // no token
  EXPECT_EQ(response.find("100 Continue"), std::string::npos) << response;
  close(fd);
}

// The TCP sockets of this process that listen: the socket inodes among
// /proc/self/fd whose state in /proc/self/net/tcp{,6} is LISTEN ("0A").
// An internal port of the front would show as one more.
int ListeningSockets() {
  std::set<std::string> mine;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) mine.insert(target.substr(8, target.size() - 9));
  }
  int n = 0;
  for (const char* table : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::ifstream tcp(table);
    std::string line;
    while (std::getline(tcp, line)) {
      std::istringstream fields(line);
      std::string f[10];
      for (std::string& field : f) fields >> field;
      n += f[3] == "0A" && mine.count(f[9]) == 1;
    }
  }
  return n;
}

TEST(HttpFrontRankEndpointTest, OneListeningSocketAndStopClosesIt) {
  const int before = ListeningSockets();
  Result<std::unique_ptr<RankEndpoint>> endpoint = RankEndpoint::Start("127.0.0.1");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
  EXPECT_EQ(ListeningSockets(), before + 1);
  // An idle keep-alive connection does not hold Stop() for httplib's
  // keep-alive timeout (5 s): the destructor below returns at once.
  const int fd = Connect((*endpoint)->port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, "GET /kvbridge/rank HTTP/1.1\r\nHost: a\r\n\r\n"));
  std::string pending;
  EXPECT_EQ(ReadResponse(fd, &pending).rfind("HTTP/1.1 503", 0), 0u);
  const auto t0 = std::chrono::steady_clock::now();
  endpoint->reset();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  EXPECT_EQ(ReadToClose(fd), "");
  close(fd);
  EXPECT_EQ(ListeningSockets(), before);
}

// A client that asks for a large answer and stops reading it: a blocking
// send waited until all of it was queued, holding the connection's thread
// and Stop() for good (review finding, session 36). Each send now gives up
// after the server's write timeout (1 s here). The client reads the first
// bytes (the barrier: the server is writing) and no more; its receive
// buffer is small.
TEST(HttpFrontServeTest, AClientThatStopsReadingDoesNotHoldStop) {
  httplib::Server http;
  const std::string big(size_t{32} << 20, 'x');
  http.Get("/big", [&big](const httplib::Request&, httplib::Response& res) {
    res.set_content(big, "text/plain");
  });
  http.set_write_timeout(1, 0);
  HttpServerThread serving;
  ASSERT_TRUE(serving.Start(http, "127.0.0.1", 0, "test server").ok());
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  int rcvbuf = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  timeval tv{20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(serving.port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_TRUE(SendAll(fd, "GET /big HTTP/1.1\r\nHost: a\r\n\r\n"));
  char first[16];
  ASSERT_GT(recv(fd, first, sizeof(first), 0), 0);
  auto stopped = std::async(std::launch::async, [&serving] { return serving.Stop(); });
  EXPECT_EQ(stopped.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "Stop() is held by a client that stopped reading";
  close(fd);  // lets an old server's send fail, so the test ends either way
  EXPECT_TRUE(stopped.get());
}

// A request that trickles in, each byte within the read timeout: Stop()
// waited for it to end (a 1 MiB body at a byte per read timeout: days).
// It closes the connection within a request too. The barrier: a first
// request on the connection was answered, so it is being served.
TEST(HttpFrontServeTest, StopClosesARequestThatTricklesIn) {
  httplib::Server http;
  http.Get("/x", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok", "text/plain");
  });
  http.set_read_timeout(1, 0);
  HttpServerThread serving;
  ASSERT_TRUE(serving.Start(http, "127.0.0.1", 0, "test server").ok());
  const int fd = Connect(serving.port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n"));
  std::string pending;
  ASSERT_EQ(ReadResponse(fd, &pending).rfind("HTTP/1.1 200", 0), 0u);
  ASSERT_TRUE(SendAll(fd, "GET /x HTTP/1.1\r\nX: "));
  std::atomic<bool> done{false};
  std::thread trickle([&] {  // a byte every 200 ms, for at most 30 s
    for (int i = 0; i < 150 && !done; ++i) {
      if (!SendAll(fd, "a")) return;
      std::this_thread::sleep_for(milliseconds(200));  // the trickle's pace
    }
  });
  auto stopped = std::async(std::launch::async, [&serving] { return serving.Stop(); });
  EXPECT_EQ(stopped.wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "Stop() waits for a request that trickles in";
  EXPECT_TRUE(stopped.get());
  done = true;
  trickle.join();
  close(fd);
}

}  // namespace
}  // namespace kvbridge::internal
