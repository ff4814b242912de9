#include "common/step_watch.h"

#include <gtest/gtest.h>

#include <future>
#include <string>
#include <thread>

namespace kvbridge::internal {
namespace {

using std::chrono::seconds;

TEST(StepWatchTest, NamesTheStepAndHowLongItHasLasted) {
  StepWatch w;
  const StepWatch::Time t0{seconds(100)};
  EXPECT_FALSE(w.BusyAt(t0).has_value());
  {
    StepWatch::Scope s(w, "message handler", t0);
    auto b = w.BusyAt(t0 + seconds(3));
    ASSERT_TRUE(b.has_value());
    EXPECT_EQ(b->for_us, seconds(3));
    EXPECT_STREQ(b->what, "message handler");
    // The same step reads the same later: an owner logs it once.
    EXPECT_EQ(w.BusyAt(t0 + seconds(4))->step, b->step);
  }
  EXPECT_FALSE(w.BusyAt(t0 + seconds(5)).has_value());
}

TEST(StepWatchTest, ANewStepIsANewEpisodeEvenUnderTheSameName) {
  StepWatch w;
  const StepWatch::Time t0{seconds(100)};
  int64_t first = 0;
  {
    StepWatch::Scope s(w, "command", t0);
    first = w.BusyAt(t0)->step;
  }
  StepWatch::Scope s(w, "command", t0 + seconds(1));
  auto b = w.BusyAt(t0 + seconds(1));
  ASSERT_TRUE(b.has_value());
  EXPECT_NE(b->step, first);
  EXPECT_EQ(b->for_us.count(), 0);
}

TEST(StepWatchTest, AStepAtTheClocksEpochIsStillAStep) {
  StepWatch w;
  StepWatch::Scope s(w, "first", StepWatch::Time{});
  ASSERT_TRUE(w.BusyAt(StepWatch::Time{seconds(2)}).has_value());
  EXPECT_EQ(w.BusyAt(StepWatch::Time{seconds(2)})->for_us, seconds(2));
}

// Read from another thread while the watched one is held in its step.
TEST(StepWatchTest, AnotherThreadSeesTheStepTheWatchedOneIsHeldIn) {
  StepWatch w;
  std::promise<void> entered, release;
  std::thread t([&] {
    StepWatch::Scope s(w, "held", std::chrono::steady_clock::now());
    entered.set_value();
    release.get_future().wait();
  });
  entered.get_future().wait();
  auto b = w.BusyAt(std::chrono::steady_clock::now());
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(std::string(b->what), "held");
  release.set_value();
  t.join();
  EXPECT_FALSE(w.BusyAt(std::chrono::steady_clock::now()).has_value());
}

}  // namespace
}  // namespace kvbridge::internal
