// Which step a thread is in and since when, readable from any other thread:
// a delivery thread stuck in one handler hears nothing and answers nothing,
// and its owner must be able to say so and name the step (a UCX transport's
// progress thread, read by the manager's ticker).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>

namespace kvbridge::internal {

class StepWatch {
 public:
  using Time = std::chrono::steady_clock::time_point;

  // The watched thread is in `what` (a string literal) from `now` until the
  // scope ends. Scopes do not nest: an inner one ends the step.
  class Scope {
   public:
    Scope(StepWatch& w, const char* what, Time now) : w_(w) { w_.Begin(what, now); }
    ~Scope() { w_.End(); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    StepWatch& w_;
  };

  struct Busy {
    std::chrono::microseconds for_us{0};
    const char* what = "";
    int64_t step = 0;  // the same for every reading of one step
  };
  // The step the thread is in at `now`, or nullopt when it is between steps.
  std::optional<Busy> BusyAt(Time now) const;

 private:
  void Begin(const char* what, Time now);
  void End();

  // 0: between steps. Written only by the watched thread; `what` before
  // `since`, so a reader that sees the same `since` twice around reading
  // `what` has that step's name.
  std::atomic<int64_t> since_us_{0};
  std::atomic<const char*> what_{""};
};

}  // namespace kvbridge::internal
