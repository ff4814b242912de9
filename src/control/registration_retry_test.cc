// A registration the server took whose answer was lost: the client's retry
// must be taken as the same registrant's, not refused for good.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>

#include "control/auth.h"
#include "control/bootstrap_client.h"
#include "kvbridge/bootstrap.h"

namespace kvbridge::internal {
namespace {

using std::chrono::milliseconds;

// A relay on loopback in front of `upstream_port` that passes each request
// on but throws the first connection's answer away (the server took the
// request; its answer never reaches the client). Connections are served one
// at a time.
class DropFirstAnswer {
 public:
  explicit DropFirstAnswer(int upstream_port) : upstream_port_(upstream_port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = Loopback(0);
    socklen_t len = sizeof(a);
    if (listen_fd_ < 0 || bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 ||
        listen(listen_fd_, 16) != 0 ||
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      return;
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~DropFirstAnswer() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (listen_fd_ >= 0) close(listen_fd_);
  }
  int port() const { return port_; }
  int answers_dropped() const { return dropped_.load(); }

 private:
  static sockaddr_in Loopback(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    return a;
  }
  void Serve() {
    for (int n = 0; !stop_;) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const int client = accept(listen_fd_, nullptr, nullptr);
      if (client < 0) continue;
      Relay(client, /*drop_answer=*/n++ == 0);
      close(client);
    }
  }
  // Until either side closes (the clients here ask for Connection: close).
  void Relay(int client, bool drop_answer) {
    const int server = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = Loopback(upstream_port_);
    if (server < 0 || connect(server, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      if (server >= 0) close(server);
      return;
    }
    bool answered = false;
    while (!stop_) {
      pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (poll(p, 2, 20) <= 0) continue;
      char buf[16384];
      if (p[0].revents != 0) {
        const ssize_t n = recv(client, buf, sizeof(buf), 0);
        if (n <= 0 || send(server, buf, n, MSG_NOSIGNAL) != n) break;
      }
      if (p[1].revents != 0) {
        const ssize_t n = recv(server, buf, sizeof(buf), 0);
        if (n <= 0) break;  // the server answered in full and closed
        answered = true;
        if (!drop_answer && send(client, buf, n, MSG_NOSIGNAL) != n) break;
      }
    }
    if (drop_answer && answered) ++dropped_;
    close(server);
  }

  const int upstream_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> dropped_{0};
  std::thread thread_;
};

RankRecord Prefill(int tp) {
  RankRecord r;
  r.attn_tp_size = 2;
  r.attn_tp_rank = tp;
  r.rank_ip = "127.0.0.1";
  r.rank_port = 18000 + tp;
  r.page_size = 16;
  r.kv_cache_dtype = "bfloat16";
  r.host = "node-a";
  r.pid = 4000 + tp;
  r.incarnation = 500 + tp;
  r.transport_address = "addr";
  r.layout = nlohmann::json{{"kv", {{"layers", 2}}}};
  return r;
}

// Review finding (session 36): the server took the PUT /route, the answer
// was lost, and the client's retry showed no credential: 403 on every try,
// the rank's heartbeats refused too, until the registry aged it to dead and
// its peers fenced a healthy rank. The retry now shows the credential its
// first try proposed, which the server took.
TEST(RegistrationRetryTest, ARetryAfterALostAnswerIsTakenAndHeartbeatsWork) {
  BootstrapServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  auto server = BootstrapServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  DropFirstAnswer relay((*server)->port());
  ASSERT_NE(relay.port(), 0);
  auto client = BootstrapClient::Create("127.0.0.1:" + std::to_string(relay.port()),
                                        milliseconds(1000), AuthTokenFromEnvironment());
  ASSERT_TRUE(client.ok());
  Status first = (*client)->RegisterRank(Prefill(0));
  EXPECT_EQ(first.code(), StatusCode::kUnavailable) << first.ToString();
  // The barrier: the server answered the first try (it took it).
  ASSERT_EQ(relay.answers_dropped(), 1);
  Status again = (*client)->RegisterRank(Prefill(0));
  ASSERT_TRUE(again.ok()) << again.ToString();
  Status beat = (*client)->Heartbeat(RankRole::kPrefill, 0, 0, 0, 0, Prefill(0).incarnation);
  EXPECT_TRUE(beat.ok()) << beat.ToString();
  // Another client proposing its own credential still cannot take the
  // registration over.
  auto other =
      BootstrapClient::Create((*server)->address(), milliseconds(1000), AuthTokenFromEnvironment());
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)->RegisterRank(Prefill(0)).code(), StatusCode::kPermissionDenied);
}

// A proposed credential that is not one (too short, characters outside
// [0-9A-Za-z_-]) is refused with a clear error; nothing is registered.
TEST(RegistrationRetryTest, AMalformedProposedCredentialIsRefused) {
  BootstrapServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  auto server = BootstrapServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  for (const std::string& bad : {std::string("short"), std::string(40, '\x7f'),
                                 std::string(300, 'a'), std::string(40, '!')}) {
    httplib::Client cli("127.0.0.1", (*server)->port());
    httplib::Headers h{{"Authorization", BearerValue(AuthTokenFromEnvironment())},
                       {kRankCredentialHeader, bad}};
    httplib::Result res = cli.Put("/route", h, Prefill(1).ToJson().dump(), "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << res->body << " for a proposal of " << bad.size() << " bytes";
    EXPECT_NE(res->body.find("rank credential it proposes"), std::string::npos) << res->body;
  }
  auto client =
      BootstrapClient::Create((*server)->address(), milliseconds(1000), AuthTokenFromEnvironment());
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE((*client)->ListRanks()->empty());
}

}  // namespace
}  // namespace kvbridge::internal
