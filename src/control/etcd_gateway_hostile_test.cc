// An etcd gateway is a stranger too: a field of an answer with another type
// than etcd's is an error of that call, never a throw. nlohmann's value()
// threw on a watch line whose cancel_reason was a number, and on a txn
// answer whose "succeeded" was a string, on threads with no handler: the
// rank aborted (hostile-input audit).
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "control/etcd_gateway.h"

namespace kvbridge::internal {
namespace {

using nlohmann::json;

TEST(EtcdGatewayHostileTest, ABoolFieldOfAnotherTypeIsRefused) {
  bool b = true;
  EXPECT_TRUE(EtcdGateway::BoolField(json::object(), "succeeded", &b));
  EXPECT_FALSE(b);  // absent: false, as etcd leaves false fields out
  EXPECT_TRUE(EtcdGateway::BoolField(json{{"succeeded", true}}, "succeeded", &b));
  EXPECT_TRUE(b);
  for (const json& bad : {json("yes"), json(1), json::array(), json(nullptr)})
    EXPECT_FALSE(EtcdGateway::BoolField(json{{"succeeded", bad}}, "succeeded", &b)) << bad;
}

// One watch stream that sends `line` and ends.
Status WatchAnswering(const std::string& line) {
  httplib::Server fake;
  fake.Post("/v3/watch", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(line + "\n", "application/json");
  });
  const int port = fake.bind_to_any_port("127.0.0.1");
  if (port <= 0) return InternalError("no port for the fake gateway");
  std::thread serving([&] { fake.listen_after_bind(); });  // the socket listens already
  EtcdGatewayOptions o;
  o.endpoints = ParseEtcdEndpoints("127.0.0.1:" + std::to_string(port)).value();
  o.retry_for = std::chrono::milliseconds(0);
  auto gateway = EtcdGateway::Create(o);
  Status s = gateway.status();
  if (gateway.ok()) {
    int64_t compacted = 0;
    s = (*gateway)->Watch(
        "/kvbridge/x/", 1, [](const std::vector<EtcdEvent>&, int64_t) { return true; }, &compacted);
  }
  fake.stop();
  serving.join();
  return s;
}

TEST(EtcdGatewayHostileTest, AWatchLineWithFieldsOfOtherTypesEndsTheStreamWithAnError) {
  Status reason = WatchAnswering(R"({"result":{"canceled":true,"cancel_reason":5}})");
  EXPECT_EQ(reason.code(), StatusCode::kUnavailable) << reason.ToString();
  EXPECT_NE(reason.message().find("canceled: 5"), std::string::npos) << reason.ToString();
  Status canceled = WatchAnswering(R"({"result":{"canceled":"yes"}})");
  EXPECT_EQ(canceled.code(), StatusCode::kInternal) << canceled.ToString();
  EXPECT_NE(canceled.message().find("'canceled' is not a bool"), std::string::npos)
      << canceled.ToString();
}

}  // namespace
}  // namespace kvbridge::internal
