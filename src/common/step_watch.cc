#include "common/step_watch.h"

#include <algorithm>

namespace kvbridge::internal {
namespace {

int64_t Micros(StepWatch::Time t) {
  // +1: a step that began at the clock's epoch is still a step (0 = none).
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count() + 1;
}

}  // namespace

void StepWatch::Begin(const char* what, Time now) {
  since_us_.store(0, std::memory_order_release);
  what_.store(what, std::memory_order_release);
  since_us_.store(Micros(now), std::memory_order_release);
}

void StepWatch::End() { since_us_.store(0, std::memory_order_release); }

std::optional<StepWatch::Busy> StepWatch::BusyAt(Time now) const {
  const int64_t since = since_us_.load(std::memory_order_acquire);
  if (since == 0) return std::nullopt;
  const char* what = what_.load(std::memory_order_acquire);
  if (since_us_.load(std::memory_order_acquire) != since) return std::nullopt;  // moved on
  Busy b;
  b.for_us = std::chrono::microseconds(std::max<int64_t>(0, Micros(now) - since));
  b.what = what;
  b.step = since;
  return b;
}

}  // namespace kvbridge::internal
