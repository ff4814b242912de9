// What a test may change in how a manager runs (CreateManager in
// api_internal.h): the Clock its core judges time on, and whether a ticker
// thread runs its liveness rounds or the test does, one at a time.
#pragma once

#include <memory>

#include "common/clock.h"

namespace kvbridge::internal {

struct CoreHooks {
  std::shared_ptr<const Clock> clock;  // null: Clock::System()
  // No ticker thread: heartbeats, silence checks and phase deadlines run
  // only when the test calls ManagerImpl::TickNow(). The registry, beat and
  // resolver threads run as always.
  bool manual_ticks = false;
};

}  // namespace kvbridge::internal
