// The time the connector's core reads. Its deadlines, silence limits and
// record times all come from one Clock: the system's in production, a
// ManualClock in tests that script time (advance it, then run one liveness
// round) instead of waiting for it to pass.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace kvbridge::internal {

using SteadyTime = std::chrono::steady_clock::time_point;
using WallTime = std::chrono::system_clock::time_point;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual SteadyTime Steady() const = 0;  // for intervals and deadlines
  virtual WallTime Wall() const = 0;      // for times other processes read
  // The system's clocks (a process-wide instance).
  static const Clock& System();
};

// A clock that moves only when told: both readings start at the system's
// and advance together. Any thread may read it while the test advances it.
class ManualClock final : public Clock {
 public:
  ManualClock();
  SteadyTime Steady() const override;
  WallTime Wall() const override;
  void Advance(std::chrono::nanoseconds d);

 private:
  const SteadyTime steady0_;
  const WallTime wall0_;
  std::atomic<int64_t> offset_ns_{0};
};

}  // namespace kvbridge::internal
