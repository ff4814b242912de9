// The rank-failure rule alone (connector/rank_failure_rule.h): records and
// rooms built here, no manager, no threads.
#include "connector/rank_failure_rule.h"

#include <gtest/gtest.h>

namespace kvbridge::internal {
namespace {

using Action = RankFailureAction;

RankId Rank(Role role, int dp, int tp, const char* instance = "") {
  RankId id;
  id.role = role;
  id.dp = dp;
  id.tp = tp;
  id.instance = instance;
  id.incarnation = 7;
  return id;
}

FailureRecord Died(const RankId& origin, FailureCause cause = FailureCause::kPeerExited) {
  FailureRecord r;
  r.origin = origin;
  r.cause = cause;
  return r;
}

// A question the rule may ask, and whether it did.
struct Question {
  bool answer = false;
  int asked = 0;
  std::function<bool()> fn() {
    return [this] {
      ++asked;
      return answer;
    };
  }
};

TEST(RankFailureRuleTest, OnlyARanksFailureActs) {
  RankFailureFacts f;
  EXPECT_EQ(JudgeRankFailure(Died(Rank(Role::kBootstrap, 0, 0)), f), Action::kIgnore);
  EXPECT_EQ(JudgeRankFailure(Died(Rank(Role::kDecode, 0, 0), FailureCause::kAborted), f),
            Action::kIgnore);
  EXPECT_EQ(JudgeRankFailure(Died(Rank(Role::kDecode, 0, 0)), f), Action::kApply);
}

TEST(RankFailureRuleTest, AnotherRanksNewsAppliesOnceUnlessItsProcessWasReplaced) {
  Question replaced;
  RankFailureFacts f;
  f.replaced = replaced.fn();
  const FailureRecord r = Died(Rank(Role::kDecode, 0, 1));
  EXPECT_EQ(JudgeRankFailure(r, f), Action::kApply);
  replaced.answer = true;
  EXPECT_EQ(JudgeRankFailure(r, f), Action::kDropStale);
  EXPECT_EQ(replaced.asked, 2);
  f.applied = true;  // applied already: not asked again
  EXPECT_EQ(JudgeRankFailure(r, f), Action::kIgnore);
  EXPECT_EQ(replaced.asked, 2);
}

TEST(RankFailureRuleTest, NewsOfThisProcessFencesItOnceAndOnlyThisLife) {
  Question first, replaced;
  RankFailureFacts f;
  f.about_self = true;
  f.current_incarnation = true;
  f.failed_it_first = first.fn();
  f.replaced = replaced.fn();
  const FailureRecord r = Died(Rank(Role::kPrefill, 0, 0));
  EXPECT_EQ(JudgeRankFailure(r, f), Action::kFenceSelf);
  // sglang's server: the detector was failed by this rank first; its word
  // does not fence this rank.
  first.answer = true;
  EXPECT_EQ(JudgeRankFailure(r, f), Action::kIgnore);
  f.this_rank_failed = true;  // fenced or fatal already
  EXPECT_EQ(JudgeRankFailure(r, f), Action::kIgnore);
  f.this_rank_failed = false;
  f.current_incarnation = false;  // an earlier life of this rank
  EXPECT_EQ(JudgeRankFailure(r, f), Action::kIgnore);
  EXPECT_EQ(first.asked, 2);
  EXPECT_EQ(replaced.asked, 0) << "a record about this rank is never stale news of another";
}

// Review finding: a rejoin forgot every failure this rank had detected,
// the ones it had published too, so a process every other rank holds
// failed was met again as healthy. What stays local is forgotten; what the
// registry holds is kept.
TEST(RankFailureRuleTest, ARejoinForgetsOnlyWhatThisProcessFoundAndKeptLocal) {
  RankId self = Rank(Role::kDecode, 0, 0);
  self.pid = 10;
  FailureRecord r = Died(Rank(Role::kPrefill, 0, 0));
  r.detected_by = self;
  EXPECT_FALSE(KeptAcrossRejoin(r, self, /*published=*/false)) << "kept local: its own view";
  EXPECT_TRUE(KeptAcrossRejoin(r, self, /*published=*/true)) << "in the registry";
  // Under an earlier incarnation (before an earlier rejoin) it is still this process.
  r.detected_by.incarnation = 6;
  EXPECT_FALSE(KeptAcrossRejoin(r, self, false));
  EXPECT_TRUE(KeptAcrossRejoin(r, self, true));
  // Another rank's finding, or another process's at this position (read
  // from the registry), is the registry's.
  r.detected_by = Rank(Role::kDecode, 0, 1);
  r.detected_by.pid = 10;
  EXPECT_TRUE(KeptAcrossRejoin(r, self, false));
  r.detected_by = self;
  r.detected_by.pid = 11;
  EXPECT_TRUE(KeptAcrossRejoin(r, self, false));
}

// What the registry holding a record makes a rejoin keep: another rank's
// failure, by position and incarnation; never this rank's own, nor a
// request's.
TEST(RankFailureRuleTest, TheRegistryHoldsRankFailuresOfOtherRanksOnly) {
  const RankId self = Rank(Role::kDecode, 0, 0);
  RankId prefill = Rank(Role::kPrefill, 0, 0);
  prefill.incarnation = 42;
  auto key = [](const RankId& id) { return id.ShortName(); };
  const auto held = RankFailureOfAnother(Died(prefill), self, key);
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(*held, std::make_pair(prefill.ShortName(), uint64_t{42}));
  EXPECT_FALSE(RankFailureOfAnother(Died(self), self, key).has_value()) << "this rank's own";
  FailureRecord request = Died(prefill);
  request.cause = FailureCause::kInvalidRequest;
  EXPECT_FALSE(RankFailureOfAnother(request, self, key).has_value()) << "a request's failure";
}

TEST(RankFailureRuleTest, ADecodeRankTouchesTheSendersWithMetadataFromItsInstanceAndDp) {
  SenderRoom room(5, SteadyTime{}, WallTime{});
  room.flows[0].decode = Rank(Role::kDecode, 1, 0, "decode-a");
  EXPECT_TRUE(RankFailureTouches(Rank(Role::kDecode, 1, 3, "decode-a"), false, room));
  EXPECT_FALSE(RankFailureTouches(Rank(Role::kDecode, 0, 0, "decode-a"), false, room)) << "dp";
  EXPECT_FALSE(RankFailureTouches(Rank(Role::kDecode, 1, 0, "decode-b"), false, room))
      << "instance";
  EXPECT_FALSE(RankFailureTouches(Rank(Role::kPrefill, 1, 0, "decode-a"), false, room)) << "role";
  SenderRoom waiting(6, SteadyTime{}, WallTime{});  // no metadata yet: no decode rank known
  EXPECT_FALSE(RankFailureTouches(Rank(Role::kDecode, 1, 0, "decode-a"), false, waiting));
  // A sibling's failure fails every request of the group.
  EXPECT_TRUE(RankFailureTouches(Rank(Role::kPrefill, 0, 1), true, waiting));
}

TEST(RankFailureRuleTest, APrefillRankTouchesTheInitializedReceiversOfItsDp) {
  ReceiverRoom room(5, 1, SteadyTime{}, WallTime{});
  room.prefill_dp_rank = 2;
  EXPECT_FALSE(RankFailureTouches(Rank(Role::kPrefill, 2, 0), false, room)) << "not initialized";
  room.initialized = true;
  EXPECT_TRUE(RankFailureTouches(Rank(Role::kPrefill, 2, 0), false, room));
  EXPECT_FALSE(RankFailureTouches(Rank(Role::kPrefill, 1, 0), false, room)) << "dp";
  EXPECT_FALSE(RankFailureTouches(Rank(Role::kDecode, 2, 0), false, room)) << "role";
  EXPECT_TRUE(RankFailureTouches(Rank(Role::kDecode, 0, 1), true, room)) << "sibling";
}

}  // namespace
}  // namespace kvbridge::internal
