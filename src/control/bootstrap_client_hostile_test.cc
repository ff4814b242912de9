// The decode side of a rank lookup when the registry (sglang's own server,
// possibly without a token) lists a "prefill rank" whose record endpoint is
// hostile: the lookup fails naming the rank and the bound, within the
// client's timeout, and the attacker's bytes are not read (the server sees
// the client go after a small part of the 64 MiB it offers). Before,
// httplib's client read all of it, and an endless one until the process
// was killed.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <string>

#include "control/auth.h"
#include "control/bootstrap_client.h"
#include "control/hostile_server_test_util.h"
#include "control/http_server.h"

namespace kvbridge::internal {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using testing::HostilePeer;
using testing::HostileServer;
using testing::kFlood;
using testing::kMaxSentBeforeClose;

// sglang's server as far as a lookup needs it: every rank is at `rank_port`.
class ListingServer {
 public:
  explicit ListingServer(int rank_port) {
    http_.Get("/route", [rank_port](const httplib::Request&, httplib::Response& res) {
      res.set_content(json{{"rank_ip", "127.0.0.1"}, {"rank_port", rank_port}}.dump(),
                      "application/json");
    });
    Status s = serving_.Start(http_, "127.0.0.1", 0, "listing server");
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  std::unique_ptr<BootstrapClient> Client(milliseconds timeout = milliseconds(3000)) {
    auto c = BootstrapClient::Create(serving_.address(), timeout, AuthTokenFromEnvironment());
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return std::move(c).value();
  }

 private:
  httplib::Server http_;
  HttpServerThread serving_;
};

struct Lookup {
  Result<RankRecord> record;
  std::string unanswered;
  milliseconds took;
};

Lookup LookUp(const HostileServer& rank, milliseconds timeout = milliseconds(3000)) {
  ListingServer listing(rank.port());
  std::unique_ptr<BootstrapClient> client = listing.Client(timeout);
  Lookup out{InternalError("not looked up"), "", milliseconds(0)};
  const auto start = std::chrono::steady_clock::now();
  out.record = client->LookUpRank(0, 0, 1, 0, &out.unanswered);
  out.took = std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start);
  return out;
}

// The lookup failed with `code`, naming the rank and `part`, and did not
// name the rank unanswered (it answered).
void ExpectRefusedByName(const Lookup& l, const HostileServer& rank, StatusCode code,
                         const std::string& part) {
  ASSERT_FALSE(l.record.ok());
  EXPECT_EQ(l.record.status().code(), code) << l.record.status().ToString();
  const std::string& m = l.record.status().message();
  EXPECT_NE(m.find("rank 127.0.0.1:" + std::to_string(rank.port())), std::string::npos) << m;
  EXPECT_NE(m.find(part), std::string::npos) << m;
  EXPECT_EQ(m.find("unreachable"), std::string::npos) << m;
  EXPECT_EQ(l.unanswered, "") << m;
}

TEST(BootstrapClientHostileRankTest, AnEndlessHeaderLineFailsTheLookupAndIsNotRead) {
  HostileServer rank(testing::EndlessHeaderLine());
  Lookup l = LookUp(rank);
  rank.Join();
  ExpectRefusedByName(l, rank, StatusCode::kResourceExhausted, "head (status line and headers)");
  EXPECT_LT(rank.sent(), kMaxSentBeforeClose);
}

TEST(BootstrapClientHostileRankTest, AnEndlessChunkedRecordStopsAtOneMiB) {
  HostileServer rank(testing::EndlessChunkedBody());
  Lookup l = LookUp(rank);
  rank.Join();
  ExpectRefusedByName(l, rank, StatusCode::kResourceExhausted, "answered with a body over 1 MiB");
  EXPECT_LT(rank.sent(), kMaxSentBeforeClose);
}

TEST(BootstrapClientHostileRankTest, AHugeContentLengthIsRefusedBeforeTheBody) {
  HostileServer rank(testing::HugeContentLength());
  Lookup l = LookUp(rank);
  rank.Join();
  ExpectRefusedByName(l, rank, StatusCode::kResourceExhausted, "Content-Length: 10000000000");
  EXPECT_LT(rank.sent(), kMaxSentBeforeClose);
}

TEST(BootstrapClientHostileRankTest, ATricklingRankDoesNotHoldTheLookupPastTheTimeout) {
  HostileServer rank(testing::Trickle());
  Lookup l = LookUp(rank, milliseconds(500));
  rank.Join();
  ASSERT_FALSE(l.record.ok());
  EXPECT_EQ(l.record.status().code(), StatusCode::kUnavailable) << l.record.status().ToString();
  EXPECT_NE(l.record.status().message().find("rank 127.0.0.1:" + std::to_string(rank.port()) +
                                             " unreachable"),
            std::string::npos)
      << l.record.status().message();
  EXPECT_EQ(l.unanswered, "127.0.0.1");
  // The registry's call and the rank's, each within the 500 ms timeout.
  // Well short of the 30 s the rank trickles for (the old client: 32.5 s),
  // with room for a sanitizer build on a loaded machine.
  EXPECT_LT(l.took, milliseconds(10000));
  EXPECT_LT(rank.sent(), size_t{100});
}

TEST(BootstrapClientHostileRankTest, ARankThatClosesMidBodyDidNotAnswer) {
  HostileServer rank([](HostilePeer& p) {
    p.Send("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"role\":");
    p.Close();
  });
  Lookup l = LookUp(rank);
  ASSERT_FALSE(l.record.ok());
  EXPECT_EQ(l.record.status().code(), StatusCode::kUnavailable) << l.record.status().ToString();
  EXPECT_NE(l.record.status().message().find("unreachable"), std::string::npos);
  EXPECT_EQ(l.unanswered, "127.0.0.1");
}

// The registry itself is a stranger too: its answers are bounded (64 MiB),
// and an oversized one is not taken for "registry unreachable".
TEST(BootstrapClientHostileRankTest, AnEndlessAnswerFromTheRegistryIsNotRead) {
  HostileServer registry([](HostilePeer& p) {
    if (p.Send("HTTP/1.1 200 OK\r\n")) p.SendFill(kFlood, 'h');
  });
  auto client = BootstrapClient::Create("127.0.0.1:" + std::to_string(registry.port()),
                                        milliseconds(3000), AuthTokenFromEnvironment());
  ASSERT_TRUE(client.ok());
  Result<ParallelInfo> info = (*client)->GetParallelInfo();
  registry.Join();
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), StatusCode::kResourceExhausted) << info.status().ToString();
  EXPECT_NE(info.status().message().find("bootstrap server 127.0.0.1:"), std::string::npos)
      << info.status().message();
  EXPECT_EQ(info.status().message().find("unreachable"), std::string::npos);
  EXPECT_LT(registry.sent(), kMaxSentBeforeClose);
}

}  // namespace
}  // namespace kvbridge::internal
