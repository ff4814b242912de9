#include "common/base64.h"

#include <gtest/gtest.h>

#include <string>

namespace kvbridge::internal {
namespace {

struct Vector {
  std::string plain;
  std::string encoded;
};

class Base64VectorTest : public ::testing::TestWithParam<Vector> {};

TEST_P(Base64VectorTest, EncodesAndDecodes) {
  const Vector& v = GetParam();
  EXPECT_EQ(Base64Encode(v.plain), v.encoded);
  Result<std::string> decoded = Base64Decode(v.encoded);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(*decoded, v.plain);
}

// RFC 4648 section 10, plus binary bytes.
INSTANTIATE_TEST_SUITE_P(Rfc4648, Base64VectorTest,
                         ::testing::Values(Vector{"", ""}, Vector{"f", "Zg=="},
                                           Vector{"fo", "Zm8="}, Vector{"foo", "Zm9v"},
                                           Vector{"foob", "Zm9vYg=="}, Vector{"fooba", "Zm9vYmE="},
                                           Vector{"foobar", "Zm9vYmFy"},
                                           Vector{std::string("\0\xff\x10", 3), "AP8Q"},
                                           Vector{"\xfb\xff", "+/8="}));

TEST(Base64Test, RoundTripsEveryByteAndLength) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  for (size_t n = 0; n <= all.size(); ++n) {
    std::string in = all.substr(all.size() - n);
    Result<std::string> out = Base64Decode(Base64Encode(in));
    ASSERT_TRUE(out.ok()) << n;
    EXPECT_EQ(*out, in) << n;
  }
}

struct BadCase {
  std::string text;
  std::string message_part;
};

class Base64BadTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(Base64BadTest, RejectsNonCanonicalInput) {
  Result<std::string> out = Base64Decode(GetParam().text);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find(GetParam().message_part), std::string::npos)
      << out.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    Malformed, Base64BadTest,
    ::testing::Values(BadCase{"Zg=", "length 3"}, BadCase{"Zm9", "length 3"},
                      BadCase{"Zm9v!A==", "offset 4"}, BadCase{"Z===", "offset 1"},
                      BadCase{"====", "offset 0"}, BadCase{"Zg==Zg==", "offset 2"},
                      BadCase{"Zh==", "padding bits"}, BadCase{"Zm9=", "padding bits"},
                      BadCase{"Zm 9", "offset 2"}, BadCase{"Zm9v\n", "length 5"}));

}  // namespace
}  // namespace kvbridge::internal
