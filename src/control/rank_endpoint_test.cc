// A prefill rank listed by sglang's own bootstrap server, which answers a
// rank lookup with rank_ip and rank_port alone: the client reads the rest of
// the record from the rank (RankEndpoint) and checks it is the rank asked for.
#include "control/rank_endpoint.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <string>

#include "control/auth.h"
#include "control/bootstrap_client.h"
#include "control/http_server.h"
#include "kvbridge/bootstrap.h"

namespace kvbridge::internal {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

RankRecord Prefill(int tp, int port) {
  RankRecord r;
  r.role = RankRole::kPrefill;
  r.attn_tp_size = 2;
  r.attn_tp_rank = tp;
  r.rank_ip = "127.0.0.1";
  r.rank_port = port;
  r.page_size = 16;
  r.kv_cache_dtype = "bfloat16";
  r.host = "node-a";
  r.pid = 4000 + tp;
  r.incarnation = 300 + tp;
  r.transport_address = std::string("\0addr", 5);
  r.layout = json{{"kv", {{"layers", 2}}}};
  return r;
}

// sglang's server, as far as these tests need it: GET /route for one rank
// answers where it is; every other route is 404.
class SglangLikeServer {
 public:
  explicit SglangLikeServer(int rank_port, std::string rank_ip = "127.0.0.1") {
    http_.Get("/route", [rank_port, rank_ip](const httplib::Request&, httplib::Response& res) {
      res.set_content(json{{"rank_ip", rank_ip}, {"rank_port", rank_port}}.dump(),
                      "application/json");
    });
    Status s = serving_.Start(http_, "127.0.0.1", 0, "sglang-like server");
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  std::unique_ptr<BootstrapClient> Client() {
    auto c =
        BootstrapClient::Create(serving_.address(), milliseconds(3000), AuthTokenFromEnvironment());
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return std::move(c).value();
  }

 private:
  httplib::Server http_;
  HttpServerThread serving_;
};

TEST(RankEndpointTest, AClientReadsTheRecordFromTheRankSglangListed) {
  auto endpoint = RankEndpoint::Start("127.0.0.1");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
  SglangLikeServer sglang((*endpoint)->port());
  std::unique_ptr<BootstrapClient> client = sglang.Client();
  // Before the rank set its record: unavailable, naming the rank.
  Result<RankRecord> early = client->GetRank(0, 0, 1, 0);
  EXPECT_EQ(early.status().code(), StatusCode::kUnavailable) << early.status().ToString();
  EXPECT_NE(early.status().message().find("prefill rank"), std::string::npos);
  const RankRecord want = Prefill(1, (*endpoint)->port());
  (*endpoint)->SetRecord(want.ToJson().dump());
  Result<RankRecord> got = client->GetRank(0, 0, 1, 0);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->transport_address, want.transport_address);
  EXPECT_EQ(got->incarnation, want.incarnation);
  EXPECT_EQ(got->pid, want.pid);
  EXPECT_EQ(got->layout, want.layout);
}

TEST(RankEndpointTest, ARankAtAnotherPositionIsRefusedNamingBoth) {
  auto endpoint = RankEndpoint::Start("127.0.0.1");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
  (*endpoint)->SetRecord(Prefill(1, (*endpoint)->port()).ToJson().dump());
  SglangLikeServer sglang((*endpoint)->port());
  Result<RankRecord> got = sglang.Client()->GetRank(0, 0, 0, 0);  // listed as tp0
  EXPECT_EQ(got.status().code(), StatusCode::kFailedPrecondition) << got.status().ToString();
  EXPECT_NE(got.status().message().find("dp0 cp0 tp0 pp0"), std::string::npos)
      << got.status().message();
  EXPECT_NE(got.status().message().find("dp0 cp0 tp1 pp0"), std::string::npos)
      << got.status().message();
  // Not JSON of a record at all: malformed, not a crash, and the rank's
  // answer, not the registry's (review finding, session 36).
  (*endpoint)->SetRecord("[1, 2]");
  const Status bad = sglang.Client()->GetRank(0, 0, 0, 0).status();
  EXPECT_EQ(bad.code(), StatusCode::kInternal);
  const std::string at = "127.0.0.1:" + std::to_string((*endpoint)->port());
  EXPECT_NE(bad.message().find("prefill rank dp0 cp0 tp0 pp0 at " + at), std::string::npos)
      << bad.message();
  EXPECT_EQ(bad.message().find("bootstrap server"), std::string::npos) << bad.message();
}

// With sglang's server, a lookup says which step did not answer: the rank's
// own endpoint (its host is given), not the registry (nothing is given).
TEST(RankEndpointTest, ALookupSaysWhenTheRankNotTheRegistryDidNotAnswer) {
  int closed = 0;
  {
    auto gone = RankEndpoint::Start("127.0.0.1");
    ASSERT_TRUE(gone.ok()) << gone.status().ToString();
    closed = (*gone)->port();
  }
  SglangLikeServer sglang(closed);
  std::string unanswered;
  Result<RankRecord> got = sglang.Client()->LookUpRank(0, 0, 1, 0, &unanswered);
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status().ToString();
  EXPECT_EQ(unanswered, "127.0.0.1");
  EXPECT_NE(
      got.status().message().find("rank 127.0.0.1:" + std::to_string(closed) + " unreachable"),
      std::string::npos)
      << got.status().message();
  // A rank that answers, but has no record yet (503): it is up, not named
  // as unanswered (review finding, session 36).
  auto early = RankEndpoint::Start("127.0.0.1");
  ASSERT_TRUE(early.ok()) << early.status().ToString();
  SglangLikeServer listing((*early)->port());
  unanswered.clear();
  got = listing.Client()->LookUpRank(0, 0, 1, 0, &unanswered);
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status().ToString();
  EXPECT_EQ(unanswered, "") << got.status().ToString();
  // The registry itself not answering: nothing is named.
  auto nobody = BootstrapClient::Create("127.0.0.1:" + std::to_string(closed), milliseconds(500),
                                        AuthTokenFromEnvironment());
  ASSERT_TRUE(nobody.ok());
  unanswered.clear();
  got = (*nobody)->LookUpRank(0, 0, 1, 0, &unanswered);
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status().ToString();
  EXPECT_EQ(unanswered, "");
}

TEST(RankEndpointTest, SglangsServerIsToldFromKvbridgesByItsRoutes) {
  SglangLikeServer sglang(1);
  Result<bool> speaks = sglang.Client()->SpeaksKvbridge();
  ASSERT_TRUE(speaks.ok()) << speaks.status().ToString();
  EXPECT_FALSE(*speaks);
  BootstrapServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.auth_token = AuthTokenFromEnvironment();
  auto ours = BootstrapServer::Start(o);
  ASSERT_TRUE(ours.ok()) << ours.status().ToString();
  auto client =
      BootstrapClient::Create((*ours)->address(), milliseconds(3000), AuthTokenFromEnvironment());
  ASSERT_TRUE(client.ok());
  speaks = (*client)->SpeaksKvbridge();
  ASSERT_TRUE(speaks.ok()) << speaks.status().ToString();
  EXPECT_TRUE(*speaks);
}

// A server that lists a rank at something other than an address (another
// host behind '@', a path, a port of its own) is malformed, named as such:
// the client builds no URL of it.
TEST(RankEndpointTest, ARankIpThatIsNotAnAddressIsMalformedByName) {
  auto endpoint = RankEndpoint::Start("127.0.0.1");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
  (*endpoint)->SetRecord(Prefill(0, (*endpoint)->port()).ToJson().dump());
  for (const char* ip : {"user@127.0.0.1", "127.0.0.1/route", "127.0.0.1:1", ""}) {
    SglangLikeServer sglang((*endpoint)->port(), ip);
    Result<RankRecord> got = sglang.Client()->GetRank(0, 0, 0, 0);
    EXPECT_EQ(got.status().code(), StatusCode::kInternal) << ip << ": " << got.status().ToString();
    EXPECT_NE(got.status().message().find("rank_ip"), std::string::npos) << got.status().message();
  }
  // The same server with the rank's address: the record is read.
  SglangLikeServer good((*endpoint)->port());
  EXPECT_TRUE(good.Client()->GetRank(0, 0, 0, 0).ok());
}

}  // namespace
}  // namespace kvbridge::internal
