#include "control/auth.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include "kvbridge/bootstrap.h"

namespace kvbridge::internal {
namespace {

// Sets (or, with nullopt, clears) both token variables for one test and
// puts back what was there.
class ScopedTokenEnv {
 public:
  ScopedTokenEnv(std::optional<std::string> kvbridge, std::optional<std::string> sglang) {
    for (const char* name : {kAuthTokenEnv, kSglangAuthTokenEnv}) {
      const char* v = std::getenv(name);
      saved_.push_back(v ? std::optional<std::string>(v) : std::nullopt);
    }
    Set(kAuthTokenEnv, kvbridge);
    Set(kSglangAuthTokenEnv, sglang);
  }
  ~ScopedTokenEnv() {
    Set(kAuthTokenEnv, saved_[0]);
    Set(kSglangAuthTokenEnv, saved_[1]);
  }

 private:
  static void Set(const char* name, const std::optional<std::string>& v) {
    if (v) {
      setenv(name, v->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  std::vector<std::optional<std::string>> saved_;
};

TEST(AuthTest, TokenComesFromTheOptionThenKvbridgeThenSglangVariable) {
  ScopedTokenEnv env("from-kvbridge", "from-sglang");
  EXPECT_EQ(ResolveAuthToken("explicit", "t").value(), "explicit");
  EXPECT_EQ(ResolveAuthToken("", "t").value(), "from-kvbridge");
  ScopedTokenEnv only_sglang(std::nullopt, "from-sglang");
  EXPECT_EQ(ResolveAuthToken("", "t").value(), "from-sglang");
}

TEST(AuthTest, NoTokenIsOneClearInstructionNamingBothVariables) {
  ScopedTokenEnv env(std::nullopt, std::nullopt);
  Result<std::string> t = ResolveAuthToken("", "prefill tp0");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kFailedPrecondition);
  for (const char* part : {"prefill tp0", "KVBRIDGE_AUTH_TOKEN",
                           "SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN", "--auth-token-file"}) {
    EXPECT_NE(t.status().message().find(part), std::string::npos) << t.status().ToString();
  }
  EXPECT_EQ(AuthTokenFromEnvironment(), "");
}

TEST(AuthTest, BootstrapServerWithoutATokenDoesNotStart) {
  ScopedTokenEnv env(std::nullopt, std::nullopt);
  BootstrapServerOptions o;
  o.port = 0;
  Result<std::unique_ptr<BootstrapServer>> s = BootstrapServer::Start(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("KVBRIDGE_AUTH_TOKEN"), std::string::npos);
}

TEST(AuthTest, TokensWithWhitespaceOrOverTheLimitAreRefused) {
  EXPECT_EQ(ResolveAuthToken("a b", "t").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveAuthToken("a\nb", "t").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveAuthToken(std::string(kMaxAuthTokenBytes + 1, 'a'), "t").status().code(),
            StatusCode::kInvalidArgument);
}

TEST(AuthTest, TokenFileIsTrimmedAndAnEmptyOrMissingFileIsNamed) {
  char path[] = "/tmp/kvb-token-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << "  s3cret\n";
  EXPECT_EQ(ReadAuthTokenFile(path).value(), "s3cret");
  std::ofstream(path) << "\n";
  Result<std::string> empty = ReadAuthTokenFile(path);
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find(path), std::string::npos);
  unlink(path);
  EXPECT_EQ(ReadAuthTokenFile(path).status().code(), StatusCode::kInvalidArgument);
}

TEST(AuthTest, BearerHeaderIsCheckedExactly) {
  EXPECT_TRUE(CheckBearer("Bearer tok", "tok").ok());
  EXPECT_TRUE(CheckBearer("bearer tok", "tok").ok());
  for (const char* bad :
       {"", "tok", "Basic dG9r", "Bearer", "Bearer to", "Bearer tokk", "Bearer TOK", "Bearertok"}) {
    Status s = CheckBearer(bad, "tok");
    EXPECT_EQ(s.code(), StatusCode::kUnauthenticated) << "'" << bad << "'";
    EXPECT_NE(s.message().find("KVBRIDGE_AUTH_TOKEN"), std::string::npos) << s.ToString();
  }
  // An empty expected token never admits anyone.
  EXPECT_EQ(CheckBearer("Bearer ", "").code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(CheckBearer("Bearer x", "").code(), StatusCode::kUnauthenticated);
}

TEST(AuthTest, ConstantTimeEqualsComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_FALSE(ConstantTimeEquals("ab", "abc"));
  EXPECT_FALSE(ConstantTimeEquals(std::string("a\0b", 3), "a"));
}

TEST(AuthTest, NewTokensAreLongAndDistinct) {
  std::string a = NewAuthToken();
  std::string b = NewAuthToken();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_NE(a, b);
  EXPECT_TRUE(ResolveAuthToken(a, "t").ok());
}

}  // namespace
}  // namespace kvbridge::internal
