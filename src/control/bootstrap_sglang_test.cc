// sglang's ranks against kvbridge's bootstrap server: the registration body,
// the parallel-info answer, the dp-rank routes and the bearer token exactly
// as sglang's common/conn.py and bootstrap_auth.py use them (docs/sglang.md,
// rows H1-H8).
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "control/auth.h"
#include "kvbridge/bootstrap.h"

namespace kvbridge::internal {
namespace {

using nlohmann::json;

// What sglang's register_to_bootstrap PUTs: no role, host, pid or
// incarnation; sizes and ranks under sglang's names.
json SglangRegistration(int tp, int system_dp_size = 1, int system_dp_rank = 0) {
  return json{{"attn_tp_size", 2},
              {"attn_tp_rank", tp},
              {"attn_cp_size", 1},
              {"attn_cp_rank", 0},
              {"attn_dp_size", 1},
              {"attn_dp_rank", 0},
              {"pp_size", 1},
              {"pp_rank", 0},
              {"system_dp_size", system_dp_size},
              {"system_dp_rank", system_dp_rank},
              {"rank_ip", "10.0.0.7"},
              {"rank_port", 17000 + tp + 10 * system_dp_rank},
              {"page_size", 16},
              {"kv_cache_dtype", "auto"},
              {"load_balance_method", "round_robin"},
              {"enable_dsa_cache_layer_split", false},
              {"prefill_http_port", 30000}};
}

const char kAllMinusOne[] =
    "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1";

class BootstrapSglangTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BootstrapServerOptions o;
    o.port = 0;
    auto server = BootstrapServer::Start(o);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
  }
  // As sglang's requests library sends it: the bearer header from
  // bootstrap_auth_headers() on writes only.
  httplib::Result Put(const std::string& path, const json& body, bool token = true) {
    return Client(token).Put(path, body.dump(), "application/json");
  }
  httplib::Result Post(const std::string& path, const json& body, bool token = true) {
    return Client(token).Post(path, body.dump(), "application/json");
  }
  httplib::Result Get(const std::string& path) { return Client(false).Get(path); }

  httplib::Client Client(bool token) {
    httplib::Client cli("127.0.0.1", server_->port());
    if (token)
      cli.set_default_headers({{"Authorization", BearerValue(AuthTokenFromEnvironment())}});
    return cli;
  }

  std::unique_ptr<BootstrapServer> server_;
};

TEST_F(BootstrapSglangTest, RegistrationBodyIsAcceptedAndParallelInfoIsSglangsDataclass) {
  httplib::Result first = Put("/route", SglangRegistration(0));
  ASSERT_TRUE(first);
  EXPECT_EQ(first->status, 200) << first->body;
  EXPECT_EQ(first->body, "OK");
  // 503 until every rank registered: decode must not build a partial layout.
  httplib::Result partial = Get(kAllMinusOne);
  ASSERT_TRUE(partial);
  EXPECT_EQ(partial->status, 503) << partial->body;
  ASSERT_EQ(Put("/route", SglangRegistration(1))->status, 200);

  httplib::Result info = Get(kAllMinusOne);
  ASSERT_TRUE(info);
  ASSERT_EQ(info->status, 200) << info->body;
  json j = json::parse(info->body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << info->body;
  // PrefillServerInfo(**data): any other key raises TypeError in sglang.
  std::set<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.insert(k);
  const std::set<std::string> sglang_fields{"attn_tp_size",
                                            "attn_cp_size",
                                            "dp_size",
                                            "pp_size",
                                            "page_size",
                                            "kv_cache_dtype",
                                            "follow_bootstrap_room",
                                            "enable_dsa_cache_layer_split",
                                            "prefill_http_port",
                                            "target_tp_rank",
                                            "target_tp_ranks",
                                            "target_cp_ranks",
                                            "target_pp_ranks",
                                            "required_dst_info_num",
                                            "required_prefill_response_num"};
  EXPECT_EQ(keys, sglang_fields) << info->body;
  EXPECT_EQ(j["attn_tp_size"], 2);
  EXPECT_EQ(j["dp_size"], 1);
  EXPECT_EQ(j["kv_cache_dtype"], "auto");
  EXPECT_EQ(j["follow_bootstrap_room"], false);  // load_balance_method round_robin
  EXPECT_EQ(j["prefill_http_port"], 30000);
  EXPECT_TRUE(j["target_tp_ranks"].is_null());

  httplib::Result rank =
      Get("/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=1&target_pp_rank=0");
  ASSERT_TRUE(rank);
  ASSERT_EQ(rank->status, 200) << rank->body;
  json r = json::parse(rank->body, nullptr, false);
  EXPECT_EQ(r["rank_ip"], "10.0.0.7");
  EXPECT_EQ(r["rank_port"], 17001);
}

// The newest sglang's prefill ranks PUT a DeepSeek-V4.1 DSpark layout (an
// object; None without DSpark); its server answers it in the parallel info
// only when given, and refuses a rank whose layout differs from the
// registered ranks'. A layout that is not an object is refused by name.
TEST_F(BootstrapSglangTest, TheDsparkLayoutIsKeptAnsweredAndTheSameOnEveryRank) {
  const json layout{{"block_size", 128}, {"target_kv", "fp8"}};
  json body = SglangRegistration(0);
  body["dsv41_spec_layout"] = layout;
  ASSERT_EQ(Put("/route", body)->status, 200);
  json other = SglangRegistration(1);
  other["dsv41_spec_layout"] = json{{"block_size", 64}};
  httplib::Result differs = Put("/route", other);
  ASSERT_TRUE(differs);
  EXPECT_EQ(differs->status, 409) << differs->body;
  EXPECT_NE(differs->body.find("dsv41_spec_layout"), std::string::npos) << differs->body;
  EXPECT_EQ(Get(kAllMinusOne)->status, 503);  // the refused rank did not register
  other["dsv41_spec_layout"] = "fp8";
  httplib::Result mistyped = Put("/route", other);
  ASSERT_TRUE(mistyped);
  EXPECT_EQ(mistyped->status, 400) << mistyped->body;
  EXPECT_NE(mistyped->body.find("dsv41_spec_layout"), std::string::npos) << mistyped->body;
  other["dsv41_spec_layout"] = layout;
  ASSERT_EQ(Put("/route", other)->status, 200);
  httplib::Result info = Get(kAllMinusOne);
  ASSERT_TRUE(info);
  ASSERT_EQ(info->status, 200) << info->body;
  json j = json::parse(info->body, nullptr, false);
  EXPECT_EQ(j["dsv41_spec_layout"], layout) << info->body;
}

TEST_F(BootstrapSglangTest, WithSystemDpTheRanksDpGroupIsItsSystemDpRank) {
  for (int dp : {0, 1}) {
    for (int tp : {0, 1}) ASSERT_EQ(Put("/route", SglangRegistration(tp, 2, dp))->status, 200);
  }
  json info = json::parse(Get(kAllMinusOne)->body, nullptr, false);
  EXPECT_EQ(info["dp_size"], 2) << info.dump();
  httplib::Result rank =
      Get("/route?prefill_dp_rank=1&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0");
  ASSERT_TRUE(rank);
  ASSERT_EQ(rank->status, 200) << rank->body;
  EXPECT_EQ(json::parse(rank->body)["rank_port"], 17010);
}

TEST_F(BootstrapSglangTest, RestartedRankOnANewPortReplacesTheOld) {
  ASSERT_EQ(Put("/route", SglangRegistration(0))->status, 200);
  ASSERT_EQ(Put("/route", SglangRegistration(1))->status, 200);
  json again = SglangRegistration(1);
  again["rank_port"] = 17555;
  ASSERT_EQ(Put("/route", again)->status, 200);
  json r = json::parse(
      Get("/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=1&target_pp_rank=0")->body);
  EXPECT_EQ(r["rank_port"], 17555);
}

TEST_F(BootstrapSglangTest, DpRankRoutesWriteWithTheTokenAndAnswerQueriesWithout) {
  httplib::Result denied = Post("/register_dp_rank", json{{"bootstrap_room", 42}, {"dp_rank", 1}},
                                /*token=*/false);
  ASSERT_TRUE(denied);
  EXPECT_EQ(denied->status, 401);
  httplib::Result ok = Post("/register_dp_rank", json{{"bootstrap_room", 42}, {"dp_rank", 1}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(ok->body, "OK");
  httplib::Result q = Post("/query_dp_ranks", json{{"bootstrap_rooms", {42, 43}}}, /*token=*/false);
  ASSERT_TRUE(q);
  ASSERT_EQ(q->status, 200) << q->body;
  EXPECT_EQ(json::parse(q->body), json({{"42", 1}}));  // unknown rooms are left out
}

TEST_F(BootstrapSglangTest, HostileDpRankBodiesAreRefusedByName) {
  struct Case {
    const char* path;
    json body;
    const char* part;
  };
  const Case cases[] = {
      {"/register_dp_rank", json{{"bootstrap_room", "42"}, {"dp_rank", 1}}, "'bootstrap_room'"},
      {"/register_dp_rank", json{{"bootstrap_room", 42}, {"dp_rank", -1}}, "'dp_rank'"},
      {"/register_dp_rank", json::array(), "object"},
      {"/query_dp_ranks", json{{"bootstrap_rooms", 42}}, "'bootstrap_rooms'"},
      {"/query_dp_ranks", json{{"bootstrap_rooms", {-1}}}, "bootstrap_rooms"},
      {"/query_dp_ranks", json{{"bootstrap_rooms", json(std::vector<int>(70000, 1))}}, "limit"},
  };
  for (const Case& c : cases) {
    httplib::Result res = Post(c.path, c.body);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << c.path << " " << res->body;
    EXPECT_NE(res->body.find(c.part), std::string::npos) << res->body;
  }
}

// A registration whose rank_ip would make decode's URL name something else
// (another host behind '@', a path, a port, a header) is refused by name and
// leaves nothing listed.
TEST_F(BootstrapSglangTest, ARankIpThatIsNotAnAddressIsRefusedByName) {
  for (const char* ip : {"", "attacker.example@10.0.0.7", "10.0.0.7/x", "10.0.0.7:80",
                         "10.0.0.7\r\nX-Injected: 1", "a b"}) {
    json body = SglangRegistration(0);
    body["rank_ip"] = ip;
    httplib::Result res = Put("/route", body);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << ip << ": " << res->body;
    EXPECT_NE(res->body.find("rank_ip"), std::string::npos) << res->body;
  }
  // Barrier: good registrations of the instance go through, and the rank's
  // route answers the good address.
  ASSERT_EQ(Put("/route", SglangRegistration(0))->status, 200);
  ASSERT_EQ(Put("/route", SglangRegistration(1))->status, 200);
  httplib::Result rank =
      Get("/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0");
  ASSERT_TRUE(rank);
  ASSERT_EQ(rank->status, 200) << rank->body;
  EXPECT_EQ(json::parse(rank->body, nullptr, false).value("rank_ip", ""), "10.0.0.7") << rank->body;
}

}  // namespace
}  // namespace kvbridge::internal
