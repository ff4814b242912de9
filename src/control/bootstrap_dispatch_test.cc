// The socket-free dispatch (bootstrap_dispatch.h) answers as the server does
// on the wire: the same routes, the same bearer check, the same limits.
#include "control/bootstrap_dispatch.h"

#include <gtest/gtest.h>

#include "control/auth.h"

namespace kvbridge::internal {
namespace {

class BootstrapDispatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BootstrapServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.auth_token = "dispatch-test-token";
    server_ = std::move(BootstrapServer::Start(o)).value();
  }
  std::string Answer(const std::string& raw) {
    return BootstrapServerAccess::Answer(*server_, raw);
  }
  std::unique_ptr<BootstrapServer> server_;
};

TEST_F(BootstrapDispatchTest, AnswersLikeTheServerOnTheWire) {
  const std::string health = Answer("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(health.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << health;
  EXPECT_EQ(health.substr(health.size() - 2), "OK") << health;

  const std::string body = R"({"ranks": 1})";
  const std::string unauthenticated =
      Answer("PUT /route HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
             "\r\n\r\n" + body);
  EXPECT_EQ(unauthenticated.rfind("HTTP/1.1 401", 0), 0u) << unauthenticated;
  EXPECT_NE(unauthenticated.find(kAuthTokenEnv), std::string::npos) << unauthenticated;

  const std::string bad_json = Answer(
      "PUT /route HTTP/1.1\r\nHost: x\r\nAuthorization: " + BearerValue("dispatch-test-token") +
      "\r\nContent-Length: 3\r\n\r\n{{{");
  EXPECT_EQ(bad_json.rfind("HTTP/1.1 400", 0), 0u) << bad_json;

  const std::string unknown = Answer("BREW /pot HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(unknown.rfind("HTTP/1.1 4", 0), 0u) << unknown;
  const std::string garbage = Answer("\x01\x02 garbage\r\n\r\n");
  EXPECT_EQ(garbage.rfind("HTTP/1.1 400", 0), 0u) << garbage;
  EXPECT_NE(garbage.find("\"error\":\"INVALID_ARGUMENT\""), std::string::npos) << garbage;
}

}  // namespace
}  // namespace kvbridge::internal
