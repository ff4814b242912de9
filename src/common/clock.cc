#include "common/clock.h"

namespace kvbridge::internal {
namespace {

class SystemClock final : public Clock {
 public:
  SteadyTime Steady() const override { return std::chrono::steady_clock::now(); }
  WallTime Wall() const override { return std::chrono::system_clock::now(); }
};

}  // namespace

const Clock& Clock::System() {
  static const SystemClock clock;
  return clock;
}

ManualClock::ManualClock()
    : steady0_(std::chrono::steady_clock::now()), wall0_(std::chrono::system_clock::now()) {}

SteadyTime ManualClock::Steady() const {
  return steady0_ + std::chrono::nanoseconds(offset_ns_.load(std::memory_order_acquire));
}

WallTime ManualClock::Wall() const {
  return wall0_ + std::chrono::duration_cast<std::chrono::system_clock::duration>(
                      std::chrono::nanoseconds(offset_ns_.load(std::memory_order_acquire)));
}

void ManualClock::Advance(std::chrono::nanoseconds d) {
  offset_ns_.fetch_add(d.count(), std::memory_order_acq_rel);
}

}  // namespace kvbridge::internal
