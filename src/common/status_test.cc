#include "kvbridge/status.h"

#include <gtest/gtest.h>

namespace kvbridge {
namespace {

struct CodeCase {
  Status (*make)(std::string);
  StatusCode code;
  const char* name;
};

class StatusCodeTest : public ::testing::TestWithParam<CodeCase> {};

TEST_P(StatusCodeTest, FactoryCarriesCodeNameAndMessage) {
  const CodeCase& c = GetParam();
  Status s = c.make("page 7");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), c.code);
  EXPECT_EQ(s.message(), "page 7");
  EXPECT_EQ(s.ToString(), std::string(c.name) + ": page 7");
  EXPECT_EQ(StatusCodeName(c.code), c.name);
}

INSTANTIATE_TEST_SUITE_P(
    AllCodes, StatusCodeTest,
    ::testing::Values(
        CodeCase{InvalidArgumentError, StatusCode::kInvalidArgument, "INVALID_ARGUMENT"},
        CodeCase{NotFoundError, StatusCode::kNotFound, "NOT_FOUND"},
        CodeCase{FailedPreconditionError, StatusCode::kFailedPrecondition, "FAILED_PRECONDITION"},
        CodeCase{UnavailableError, StatusCode::kUnavailable, "UNAVAILABLE"},
        CodeCase{DeadlineExceededError, StatusCode::kDeadlineExceeded, "DEADLINE_EXCEEDED"},
        CodeCase{AbortedError, StatusCode::kAborted, "ABORTED"},
        CodeCase{DataLossError, StatusCode::kDataLoss, "DATA_LOSS"},
        CodeCase{ResourceExhaustedError, StatusCode::kResourceExhausted, "RESOURCE_EXHAUSTED"},
        CodeCase{InternalError, StatusCode::kInternal, "INTERNAL"},
        CodeCase{UnimplementedError, StatusCode::kUnimplemented, "UNIMPLEMENTED"},
        CodeCase{UnauthenticatedError, StatusCode::kUnauthenticated, "UNAUTHENTICATED"}));

TEST(StatusTest, DefaultIsOkAndDropsMessage) {
  EXPECT_TRUE(Status().ok());
  EXPECT_EQ(Status().ToString(), "OK");
  Status s(StatusCode::kOk, "ignored");
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.message(), "");
}

TEST(StatusTest, WithContextPrefixesErrorsOnly) {
  EXPECT_EQ(UnavailableError("peer gone").WithContext("room 3").message(), "room 3: peer gone");
  EXPECT_EQ(UnavailableError("x").WithContext("c").code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Status().WithContext("c").ok());
}

Result<int> Half(int v) {
  if (v % 2 != 0) return InvalidArgumentError("odd " + std::to_string(v));
  return v / 2;
}

Result<int> Quarter(int v) {
  KVB_ASSIGN_OR_RETURN(int h, Half(v));
  KVB_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckEven(int v) {
  KVB_RETURN_IF_ERROR(Half(v).status());
  return Status();
}

TEST(ResultTest, ValueAndErrorPropagate) {
  Result<int> ok = Quarter(8);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 2);
  EXPECT_TRUE(ok.status().ok());

  Result<int> bad = Quarter(6);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "odd 3");

  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_EQ(CheckEven(5).code(), StatusCode::kInvalidArgument);
}

TEST(ResultTest, OkStatusIsNotAValue) {
  Result<int> r{Status()};
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(ResultTest, MoveOnlyValues) {
  Result<std::unique_ptr<int>> r(std::make_unique<int>(5));
  ASSERT_TRUE(r.ok());
  std::unique_ptr<int> p = std::move(r).value();
  EXPECT_EQ(*p, 5);
}

}  // namespace
}  // namespace kvbridge
