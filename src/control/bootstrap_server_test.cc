#include <gtest/gtest.h>
#include <httplib.h>

#include <string>
#include <thread>

#include "control/auth.h"
#include "control/bootstrap_client.h"
#include "kvbridge/bootstrap.h"

namespace kvbridge::internal {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

RankRecord Prefill(int tp, uint64_t incarnation = 0) {
  RankRecord r;
  r.attn_tp_size = 2;
  r.attn_tp_rank = tp;
  r.rank_ip = "127.0.0.1";
  r.rank_port = 18000 + tp;
  r.page_size = 16;
  r.kv_cache_dtype = "bfloat16";
  r.host = "node-a";
  r.pid = 4000 + tp;
  r.incarnation = incarnation != 0 ? incarnation : 200 + tp;
  r.transport_address = std::string("\0addr", 5);
  r.layout = json{{"kv", {{"layers", 2}}}};
  return r;
}

void ExpectError(const Status& s, StatusCode code, const std::string& part) {
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_NE(s.message().find(part), std::string::npos) << s.ToString();
}

// A real server on a free port of the loopback interface, and a client.
class BootstrapServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BootstrapServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.clock = [this] {
      return std::chrono::steady_clock::time_point(
          std::chrono::steady_clock::duration(fake_now_.load()));
    };
    Result<std::unique_ptr<BootstrapServer>> server = BootstrapServer::Start(o);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    Result<std::unique_ptr<BootstrapClient>> client =
        BootstrapClient::Create(server_->address(), milliseconds(5000), AuthTokenFromEnvironment());
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_ = std::move(client).value();
  }
  void Advance(milliseconds d) { fake_now_ += std::chrono::steady_clock::duration(d).count(); }
  // Another rank's client: one client holds one rank's credential.
  std::unique_ptr<BootstrapClient> NewClient() {
    return BootstrapClient::Create(server_->address(), milliseconds(5000),
                                   AuthTokenFromEnvironment())
        .value();
  }

  // Raw request for input the typed client never sends.
  httplib::Result Raw(const std::string& method, const std::string& path,
                      const std::string& body = "") {
    httplib::Client cli("127.0.0.1", server_->port());
    cli.set_default_headers({{"Authorization", BearerValue(AuthTokenFromEnvironment())}});
    if (method == "GET") return cli.Get(path);
    if (method == "PUT") return cli.Put(path, body, "application/json");
    if (method == "DELETE") return cli.Delete(path);
    return cli.Post(path, body, "application/json");
  }

  std::atomic<std::chrono::steady_clock::rep> fake_now_{
      std::chrono::steady_clock::duration(std::chrono::hours(1)).count()};
  std::unique_ptr<BootstrapServer> server_;
  std::unique_ptr<BootstrapClient> client_;
};

TEST_F(BootstrapServerTest, ReportsTheBoundAddress) {
  EXPECT_GT(server_->port(), 0);
  EXPECT_EQ(server_->address(), "127.0.0.1:" + std::to_string(server_->port()));
  EXPECT_EQ(client_->port(), server_->port());
  EXPECT_TRUE(client_->Health().ok());
  httplib::Result res = Raw("GET", "/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "OK");
}

TEST_F(BootstrapServerTest, RouteLookupsFollowSglangSemantics) {
  ExpectError(client_->GetParallelInfo().status(), StatusCode::kUnavailable, "no prefill rank");
  ASSERT_TRUE(client_->RegisterRank(Prefill(0)).ok());
  ExpectError(client_->GetParallelInfo().status(), StatusCode::kUnavailable,
              "1 of 2 prefill ranks registered");
  Status partial = client_->GetRank(0, 0, 0, 0).status();
  ExpectError(partial, StatusCode::kUnavailable, "1 of 2 prefill ranks registered");
  ExpectError(partial, StatusCode::kUnavailable, server_->address());
  httplib::Result raw = Raw("GET",
                            "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0"
                            "&target_pp_rank=0");
  ASSERT_TRUE(raw);
  EXPECT_EQ(raw->status, 503);

  ASSERT_TRUE(client_->RegisterRank(Prefill(1)).ok());
  Result<RankRecord> r = client_->GetRank(0, 0, 1, 0);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->ToJson(), Prefill(1).ToJson());
  ExpectError(client_->GetRank(0, 0, 2, 0).status(), StatusCode::kNotFound, "tp2");
  ExpectError(client_->GetRank(-1, 0, 0, 0).status(), StatusCode::kInvalidArgument, ">= 0");
  Result<ParallelInfo> info = client_->GetParallelInfo();
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->attn_tp_size, 2);
  EXPECT_EQ(info->ranks_registered, 2);

  RankRecord conflicting = Prefill(1, 999);
  conflicting.page_size = 32;
  ExpectError(client_->RegisterRank(conflicting), StatusCode::kFailedPrecondition, "page_size 32");
  RankRecord invalid = Prefill(0);
  invalid.pid = -5;  // 0 is allowed: an sglang rank does not send one
  ExpectError(client_->RegisterRank(invalid), StatusCode::kInvalidArgument, "pid");
}

TEST_F(BootstrapServerTest, LivenessAndFailuresOverHttp) {
  std::unique_ptr<BootstrapClient> tp1 = NewClient(), dec = NewClient();
  ASSERT_TRUE(client_->RegisterRank(Prefill(0)).ok());
  ASSERT_TRUE(tp1->RegisterRank(Prefill(1)).ok());
  RankRecord decode = Prefill(0, 77);
  decode.role = RankRole::kDecode;
  ASSERT_TRUE(dec->RegisterRank(decode).ok());
  Advance(milliseconds(1500));
  ASSERT_TRUE(client_->Heartbeat(RankRole::kPrefill, 0, 0, 0, 0, 200).ok());
  ASSERT_TRUE(dec->Heartbeat(RankRole::kDecode, 0, 0, 0, 0, 77).ok());
  ExpectError(tp1->Heartbeat(RankRole::kPrefill, 0, 0, 1, 0, 5), StatusCode::kFailedPrecondition,
              "held by incarnation 201");
  ExpectError(dec->Heartbeat(RankRole::kDecode, 0, 0, 1, 0, 5), StatusCode::kNotFound,
              "unregistered decode rank");

  Result<std::vector<RankStatus>> ranks = client_->ListRanks();
  ASSERT_TRUE(ranks.ok()) << ranks.status().ToString();
  ASSERT_EQ(ranks->size(), 3u);
  EXPECT_EQ((*ranks)[0].state, Liveness::kAlive);
  EXPECT_EQ((*ranks)[1].state, Liveness::kUnresponsive);
  EXPECT_EQ((*ranks)[1].age, milliseconds(1500));
  EXPECT_EQ((*ranks)[2].record.role, RankRole::kDecode);
  EXPECT_EQ((*ranks)[2].record.transport_address, decode.transport_address);

  // Decode reports prefill tp1's exit, in its own name.
  const json by_decode{{"role", "decode"}, {"dp", 0}, {"tp", 0}, {"pp", 0}, {"incarnation", 77}};
  json record{{"room", 42},
              {"cause", "peer_exited"},
              {"origin", {{"role", "prefill"}, {"dp", 0}, {"tp", 1}, {"pp", 0}, {"cp", 0}}},
              {"detected_by", by_decode}};
  Result<uint64_t> seq = dec->PublishFailure(record);
  ASSERT_TRUE(seq.ok()) << seq.status().ToString();
  EXPECT_EQ(*seq, 1u);
  // A request's own failure (an abort) is kept but marks no rank dead.
  json abort{{"room", 43},
             {"cause", "aborted"},
             {"origin", {{"role", "decode"}, {"dp", 0}, {"tp", 0}, {"pp", 0}}},
             {"detected_by", by_decode}};
  ASSERT_TRUE(dec->PublishFailure(abort).ok());
  Result<FailureBatch> batch = client_->FailuresSince(0);
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  EXPECT_EQ(batch->latest_seq, 2u);
  ASSERT_EQ(batch->records.size(), 2u);
  EXPECT_EQ(batch->records[0]["cause"], "peer_exited");
  EXPECT_EQ(client_->FailuresSince(1)->records.size(), 1u);
  EXPECT_EQ(client_->ListRanks()->at(1).state, Liveness::kDead);
  EXPECT_EQ(client_->ListRanks()->at(1).dead_by_seq, 1u);
  ExpectError(client_->PublishFailure(json::array()).status(), StatusCode::kInvalidArgument,
              "object");
  // The same record in prefill tp0's name, from decode's client: refused.
  record["detected_by"] = {
      {"role", "prefill"}, {"dp", 0}, {"tp", 0}, {"pp", 0}, {"incarnation", 200}};
  ExpectError(dec->PublishFailure(record).status(), StatusCode::kPermissionDenied,
              "not the one given to prefill dp0 cp0 tp0");
  EXPECT_EQ(client_->FailuresSince(0)->latest_seq, 2u);
}

// A restarted server has lost its table: the next heartbeat registers the
// rank again (as docs/errors.md, registry_lost, promises), with a new
// credential the rank's records then carry.
TEST_F(BootstrapServerTest, AHeartbeatToARestartedServerRegistersTheRankAgain) {
  ASSERT_TRUE(client_->RegisterRank(Prefill(0)).ok());
  const int port = server_->port();
  server_.reset();
  BootstrapServerOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  Result<std::unique_ptr<BootstrapServer>> fresh = BootstrapServer::Start(o);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  server_ = std::move(fresh).value();
  EXPECT_TRUE(client_->ListRanks()->empty());
  ASSERT_TRUE(client_->Heartbeat(RankRole::kPrefill, 0, 0, 0, 0, 200).ok());
  Result<std::vector<RankStatus>> ranks = client_->ListRanks();
  ASSERT_EQ(ranks->size(), 1u);
  EXPECT_EQ(ranks->front().record.ToJson(), Prefill(0).ToJson());
  json own{{"cause", "local_error"},
           {"origin", {{"role", "prefill"}, {"dp", 0}, {"tp", 0}, {"pp", 0}, {"incarnation", 200}}},
           {"detected_by",
            {{"role", "prefill"}, {"dp", 0}, {"tp", 0}, {"pp", 0}, {"incarnation", 200}}}};
  EXPECT_TRUE(client_->PublishFailure(own).ok());
}

struct RawCase {
  std::string method;
  std::string path;
  std::string body;
  int http_status;
  std::string error;         // code name in the body
  std::string message_part;  // in the body's message
};

class BootstrapServerRawTest : public BootstrapServerTest,
                               public ::testing::WithParamInterface<RawCase> {};

TEST_P(BootstrapServerRawTest, AnswersMalformedInputWithAJsonError) {
  ASSERT_TRUE(client_->RegisterRank(Prefill(0)).ok());
  const RawCase& c = GetParam();
  httplib::Result res = Raw(c.method, c.path, c.body);
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, c.http_status) << res->body;
  json body = json::parse(res->body, nullptr, false);
  ASSERT_TRUE(body.is_object()) << res->body;
  EXPECT_EQ(body["error"], c.error) << res->body;
  EXPECT_NE(body["message"].get<std::string>().find(c.message_part), std::string::npos)
      << res->body;
}

const std::string kRoute = "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_pp_rank=0";

INSTANTIATE_TEST_SUITE_P(
    Inputs, BootstrapServerRawTest,
    ::testing::Values(
        RawCase{"GET", kRoute, "", 400, "INVALID_ARGUMENT", "'target_tp_rank'"},
        RawCase{"GET", kRoute + "&target_tp_rank=abc", "", 400, "INVALID_ARGUMENT", "'abc'"},
        RawCase{"GET", kRoute + "&target_tp_rank=1x", "", 400, "INVALID_ARGUMENT", "'1x'"},
        RawCase{"GET", kRoute + "&target_tp_rank=-2", "", 400, "INVALID_ARGUMENT", "-2"},
        RawCase{"GET", kRoute + "&target_tp_rank=99999999999", "", 400, "INVALID_ARGUMENT",
                "out of range"},
        RawCase{"GET", kRoute + "&target_tp_rank=-1", "", 400, "INVALID_ARGUMENT", "all -1"},
        RawCase{"GET", kRoute + "&target_tp_rank=5", "", 404, "NOT_FOUND", "tp5"},
        RawCase{"GET", kRoute + "&target_tp_rank=1", "", 503, "UNAVAILABLE", "1 of 2"},
        RawCase{"PUT", "/route", "{not json", 400, "INVALID_ARGUMENT", "not valid JSON"},
        RawCase{"PUT", "/route", "{\"role\": \"prefill\"}", 400, "INVALID_ARGUMENT",
                "'attn_tp_size'"},
        RawCase{"PUT", "/heartbeat", "{\"role\": \"prefill\", \"dp\": 0}", 400, "INVALID_ARGUMENT",
                "'cp'"},
        RawCase{"PUT", "/heartbeat",
                "{\"role\":\"x\",\"dp\":0,\"cp\":0,\"tp\":0,\"pp\":0,\"incarnation\":1}", 400,
                "INVALID_ARGUMENT", "role"},
        RawCase{"PUT", "/heartbeat",
                "{\"role\":\"prefill\",\"dp\":0,\"cp\":0,\"tp\":0,\"pp\":0,\"incarnation\":1}", 409,
                "FAILED_PRECONDITION", "incarnation 200"},
        RawCase{"POST", "/failure", "[1, 2]", 400, "INVALID_ARGUMENT", "object"},
        RawCase{"POST", "/failure", "", 400, "INVALID_ARGUMENT", "not valid JSON"},
        RawCase{"GET", "/failures?since=x", "", 400, "INVALID_ARGUMENT", "'since'"},
        RawCase{"GET", "/failures?since=-1", "", 400, "INVALID_ARGUMENT", "'since'"},
        RawCase{"GET", "/nowhere", "", 404, "NOT_FOUND", "/nowhere"},
        RawCase{"DELETE", "/route", "", 405, "INVALID_ARGUMENT", "DELETE not allowed"},
        RawCase{"POST", "/route", "{}", 405, "INVALID_ARGUMENT", "POST not allowed"}));

TEST_F(BootstrapServerTest, SecondServerOnTheSamePortIsAlreadyExists) {
  BootstrapServerOptions o;
  o.host = "127.0.0.1";
  o.port = server_->port();
  Result<std::unique_ptr<BootstrapServer>> second = BootstrapServer::Start(o);
  ASSERT_FALSE(second.ok());
  ExpectError(second.status(), StatusCode::kAlreadyExists, server_->address());
  EXPECT_TRUE(client_->Health().ok());
}

TEST_F(BootstrapServerTest, StopIsIdempotentAndClientsThenSeeUnavailable) {
  const std::string address = server_->address();
  server_->Stop();
  server_->Stop();
  ExpectError(client_->Health(), StatusCode::kUnavailable,
              "bootstrap server " + address + " unreachable");
  ExpectError(client_->GetParallelInfo().status(), StatusCode::kUnavailable, "unreachable");
}

struct OptionsCase {
  std::function<void(BootstrapServerOptions&)> mutate;
  StatusCode code;
  std::string part;
};

class BootstrapServerOptionsTest : public ::testing::TestWithParam<OptionsCase> {};

TEST_P(BootstrapServerOptionsTest, StartRejects) {
  BootstrapServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  GetParam().mutate(o);
  Result<std::unique_ptr<BootstrapServer>> s = BootstrapServer::Start(o);
  ASSERT_FALSE(s.ok());
  ExpectError(s.status(), GetParam().code, GetParam().part);
}

INSTANTIATE_TEST_SUITE_P(
    Bad, BootstrapServerOptionsTest,
    ::testing::Values(
        OptionsCase{[](auto& o) { o.port = 70000; }, StatusCode::kInvalidArgument, "port 70000"},
        OptionsCase{[](auto& o) { o.port = -1; }, StatusCode::kInvalidArgument, "port -1"},
        OptionsCase{[](auto& o) { o.host = ""; }, StatusCode::kInvalidArgument, "host"},
        OptionsCase{[](auto& o) { o.threads = 0; }, StatusCode::kInvalidArgument, "threads"},
        OptionsCase{[](auto& o) { o.dead_after = milliseconds(10); }, StatusCode::kInvalidArgument,
                    "dead_after"},
        OptionsCase{[](auto& o) { o.max_failure_records = 0; }, StatusCode::kInvalidArgument,
                    "max_failure_records"},
        OptionsCase{[](auto& o) { o.host = "256.1.1.1"; }, StatusCode::kUnavailable,
                    "256.1.1.1:0"}));

struct AddressCase {
  std::string address;
  bool ok;
  std::string host;
  int port;
};

AddressCase Bad(const std::string& address) { return AddressCase{address, false, "", 0}; }

class BootstrapClientAddressTest : public ::testing::TestWithParam<AddressCase> {};

TEST_P(BootstrapClientAddressTest, ParsesHostPortStrictly) {
  const AddressCase& c = GetParam();
  Result<std::unique_ptr<BootstrapClient>> client =
      BootstrapClient::Create(c.address, milliseconds(100), AuthTokenFromEnvironment());
  if (!c.ok) {
    ASSERT_FALSE(client.ok());
    ExpectError(client.status(), StatusCode::kInvalidArgument, "'" + c.address + "'");
    return;
  }
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_EQ((*client)->host(), c.host);
  EXPECT_EQ((*client)->port(), c.port);
}

INSTANTIATE_TEST_SUITE_P(Addresses, BootstrapClientAddressTest,
                         ::testing::Values(AddressCase{"127.0.0.1:8998", true, "127.0.0.1", 8998},
                                           AddressCase{"prefill-0.svc:1", true, "prefill-0.svc", 1},
                                           AddressCase{"[::1]:65535", true, "::1", 65535},
                                           Bad("127.0.0.1"), Bad(":8998"), Bad("host:"),
                                           Bad("host:0"), Bad("host:65536"), Bad("host:+80"),
                                           Bad("host:80x"), Bad("::1:80"), Bad("[::1]80"),
                                           Bad("[::1:80"), Bad("http://h:80"), Bad("a b:80"),
                                           Bad("")));

TEST(BootstrapClientTest, RejectsNonPositiveTimeout) {
  ExpectError(BootstrapClient::Create("h:1", milliseconds(0), "").status(),
              StatusCode::kInvalidArgument, "timeout");
}

// A server that answers every route with garbage.
TEST(BootstrapClientTest, MalformedAnswersAreInternal) {
  httplib::Server bad;
  bad.Get(".*", [](const httplib::Request& req, httplib::Response& res) {
    res.set_content(req.path == "/ranks" ? "not json" : "{\"ranks\": 3}", "application/json");
  });
  bad.Post(".*", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"seq\": \"one\"}", "application/json");
  });
  int port = bad.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread t([&] { bad.listen_after_bind(); });
  while (!bad.is_running()) std::this_thread::sleep_for(milliseconds(1));
  auto client = BootstrapClient::Create("127.0.0.1:" + std::to_string(port), milliseconds(5000),
                                        AuthTokenFromEnvironment());
  ASSERT_TRUE(client.ok());
  ExpectError((*client)->ListRanks().status(), StatusCode::kInternal, "not valid JSON");
  ExpectError((*client)->GetRank(0, 0, 0, 0).status(), StatusCode::kInternal, "'attn_tp_size'");
  ExpectError((*client)->GetParallelInfo().status(), StatusCode::kInternal, "attn_tp_size");
  ExpectError((*client)->FailuresSince(0).status(), StatusCode::kInternal, "'records'");
  ExpectError((*client)->PublishFailure(json::object()).status(), StatusCode::kInternal, "'seq'");
  bad.stop();
  t.join();
}

}  // namespace
}  // namespace kvbridge::internal
