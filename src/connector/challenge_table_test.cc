// What prefill remembers of handshakes in progress (challenge_table.h),
// alone: bounded, and nothing lost there costs a genuine handshake more
// than a new endpoint.
#include "connector/challenge_table.h"

#include <gtest/gtest.h>

#include <chrono>

namespace kvbridge::internal {
namespace {

RankId Decode(int64_t pid) {
  RankId id;
  id.role = Role::kDecode;
  id.host = "host-b";
  id.pid = pid;
  id.incarnation = 7;
  return id;
}

const SteadyTime kT0{std::chrono::seconds(1000)};

TEST(ChallengeTableTest, KeepsTheNewestEndpointsAndLetsTheOldestGo) {
  ChallengeTable t;
  for (uint64_t s = 1; s <= ChallengeTable::kMaxEndpoints; ++s)
    EXPECT_TRUE(t.Keep(s, Decode(s), 100 + s, kT0).close_now.empty());
  const SteadyTime later = kT0 + std::chrono::milliseconds(10);
  EXPECT_TRUE(t.Keep(1000, Decode(1000), 999, later).close_now.empty());
  EXPECT_FALSE(t.TakeEndpoint(1, Decode(1)).has_value()) << "session 1's, the oldest, let go";
  EXPECT_EQ(t.TakeEndpoint(2, Decode(2)), std::optional<PeerId>(102));
  EXPECT_EQ(t.TakeEndpoint(1000, Decode(1000)), std::optional<PeerId>(999));
  EXPECT_FALSE(t.TakeEndpoint(1000, Decode(1000)).has_value()) << "taken twice";
  // Closed only once its challenge has had time to leave (a flood of Hellos
  // handled before it did would otherwise drop it).
  EXPECT_TRUE(t.Due(later + ChallengeTable::kCloseDelay - std::chrono::milliseconds(1)).empty());
  EXPECT_EQ(t.Due(later + ChallengeTable::kCloseDelay), std::vector<PeerId>{101});
  EXPECT_TRUE(t.Due(later + ChallengeTable::kCloseDelay).empty()) << "closed twice";
}

// Past kMaxClosing endpoints let go and not yet due, the oldest close at
// once: a flood keeps what prefill holds open bounded.
TEST(ChallengeTableTest, EndpointsLetGoAreBounded) {
  ChallengeTable t;
  const size_t n = ChallengeTable::kMaxEndpoints + ChallengeTable::kMaxClosing + 3;
  std::vector<PeerId> closed_now;
  for (uint64_t s = 1; s <= n; ++s) {
    const ChallengeTable::Kept k = t.Keep(s, Decode(s), 100 + s, kT0);
    closed_now.insert(closed_now.end(), k.close_now.begin(), k.close_now.end());
  }
  EXPECT_EQ(closed_now, (std::vector<PeerId>{101, 102, 103}));
  const std::vector<PeerId> due = t.Due(kT0 + ChallengeTable::kCloseDelay);
  ASSERT_EQ(due.size(), ChallengeTable::kMaxClosing);
  EXPECT_EQ(due.front(), 104u);
  EXPECT_EQ(t.Clear().size(), ChallengeTable::kMaxEndpoints);
}

TEST(ChallengeTableTest, AnEndpointIsTakenOnlyForTheProcessWhoseHelloItAnswers) {
  ChallengeTable t;
  t.Keep(5, Decode(1), 42, kT0);
  EXPECT_FALSE(t.TakeEndpoint(5, Decode(2)).has_value());
  EXPECT_FALSE(t.TakeEndpoint(6, Decode(1)).has_value());
  EXPECT_EQ(t.TakeEndpoint(5, Decode(1)), std::optional<PeerId>(42));
}

TEST(ChallengeTableTest, ExpiredAndReplacedEndpointsAreLetGo) {
  ChallengeTable t;
  t.Keep(1, Decode(1), 11, kT0);
  t.Keep(2, Decode(2), 12, kT0 + std::chrono::seconds(30));
  // The same Hello again: the same session, on a new endpoint.
  t.Keep(2, Decode(2), 13, kT0 + std::chrono::seconds(31));
  EXPECT_EQ(t.Due(kT0 + std::chrono::seconds(32)), std::vector<PeerId>{12});
  const SteadyTime expired = kT0 + ChallengeTable::kLifetime + std::chrono::seconds(1);
  t.Keep(3, Decode(3), 14, expired);
  EXPECT_FALSE(t.TakeEndpoint(1, Decode(1)).has_value());
  EXPECT_EQ(t.Due(expired + ChallengeTable::kCloseDelay), std::vector<PeerId>{11});
  t.Keep(4, Decode(4), 15, expired);
  t.Keep(4, Decode(4), 16, expired);  // 15 let go, not yet due: a rejoin closes it too
  EXPECT_EQ(t.Clear(), (std::vector<PeerId>{13, 14, 16, 15}));
  EXPECT_TRUE(t.Clear().empty());
}

TEST(ChallengeTableTest, AHelloSentAgainBeforeItsProofIsNoticed) {
  ChallengeTable t;
  EXPECT_FALSE(t.Keep(1, Decode(1), 11, kT0).again_after_s.has_value());
  const ChallengeTable::Kept again = t.Keep(2, Decode(1), 12, kT0 + std::chrono::seconds(2));
  ASSERT_TRUE(again.again_after_s.has_value());
  EXPECT_DOUBLE_EQ(*again.again_after_s, 2.0);
  EXPECT_EQ(t.TakeEndpoint(1, Decode(1)), std::optional<PeerId>(11))
      << "the first challenge's proof may still come";
}

TEST(ChallengeTableTest, ASessionIsProvenOnceWhileItsChallengeIsGood) {
  ChallengeTable t;
  EXPECT_TRUE(t.FirstProof(9, kT0));
  EXPECT_FALSE(t.FirstProof(9, kT0 + std::chrono::seconds(1)));
  EXPECT_FALSE(t.FirstProof(9, kT0 + ChallengeTable::kLifetime));
  EXPECT_TRUE(t.FirstProof(10, kT0));
  // Past the time a challenge is good, no proof of it checks any more
  // (ChallengeMaker::Find), and the session is forgotten.
  EXPECT_TRUE(t.FirstProof(9, kT0 + ChallengeTable::kLifetime + std::chrono::seconds(1)));
}

// With no Hello coming, the ticker still lets expired endpoints go.
TEST(ChallengeTableTest, ATickLetsExpiredEndpointsGoWithoutAnotherHello) {
  ChallengeTable t;
  t.Keep(1, Decode(1), 11, kT0);
  t.Keep(2, Decode(2), 12, kT0 + std::chrono::seconds(10));
  const SteadyTime expired = kT0 + ChallengeTable::kLifetime + std::chrono::seconds(1);
  EXPECT_TRUE(t.Due(expired).empty()) << "let go, not closed at once";
  EXPECT_FALSE(t.TakeEndpoint(1, Decode(1)).has_value());
  EXPECT_EQ(t.Due(expired + ChallengeTable::kCloseDelay), std::vector<PeerId>{11});
  EXPECT_EQ(t.TakeEndpoint(2, Decode(2)), std::optional<PeerId>(12));
}

TEST(ChallengeTableTest, AFailedEndpointIsForgottenNamingItsHellosSender) {
  ChallengeTable t;
  t.Keep(1, Decode(4), 21, kT0);
  EXPECT_FALSE(t.Forget(22).has_value());
  const std::optional<RankId> from = t.Forget(21);
  ASSERT_TRUE(from.has_value());
  EXPECT_EQ(from->pid, 4);
  EXPECT_FALSE(t.TakeEndpoint(1, Decode(4)).has_value());
}

}  // namespace
}  // namespace kvbridge::internal
