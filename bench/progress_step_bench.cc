#include "bench/progress_step_bench.h"

#include <fmt/core.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>

#include "bench/bench_util.h"
#include "common/step_watch.h"

namespace kvbridge::bench {
namespace {

// An idle UCX worker (the progress loop's call when nothing arrives: the
// cheapest pass, so the one the watch adds most to).
struct IdleWorker {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  ~IdleWorker() {
    if (worker != nullptr) ucp_worker_destroy(worker);
    if (context != nullptr) ucp_cleanup(context);
  }
  bool Open() {
    ucp_config_t* config = nullptr;
    if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) return false;
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    const ucs_status_t s = ucp_init(&params, config, &context);
    ucp_config_release(config);
    if (s != UCS_OK) return false;
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    return ucp_worker_create(context, &wp, &worker) == UCS_OK;
  }
};

// Nanoseconds per pass of `calls` passes.
template <typename Pass>
double NsPerPass(uint64_t calls, Pass pass) {
  const Clock::time_point start = Clock::now();
  unsigned did = 0;
  for (uint64_t i = 0; i < calls; ++i) did |= pass();
  const double ns = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
  if (did == 0xdeadbeef) std::puts("");  // keeps the loop
  return ns / static_cast<double>(calls);
}

}  // namespace

int RunProgressStepBench(const ProgressStepOptions& o) {
  IdleWorker w;
  if (!w.Open()) {
    std::fprintf(stderr, "bench progress-step: cannot open a UCX worker\n");
    return 1;
  }
  using SteadyClock = std::chrono::steady_clock;
  internal::StepWatch watch;
  SteadyClock::time_point last{};
  // The progress loop's pass (UcxTransport::ProgressLoop) reads the clock
  // once, for its spin, with or without the step named around the call.
  auto before = [&] {
    const SteadyClock::time_point now = SteadyClock::now();
    const unsigned did = ucp_worker_progress(w.worker);
    if (did != 0) last = now;
    return did;
  };
  auto named = [&] {
    const SteadyClock::time_point now = SteadyClock::now();
    unsigned did;
    {
      internal::StepWatch::Scope step(watch, "UCX progress", now);
      did = ucp_worker_progress(w.worker);
    }
    if (did != 0) last = now;
    return did;
  };
  double bare = std::numeric_limits<double>::max();
  double ref = bare, watched = bare;
  for (int r = 0; r < o.rounds; ++r) {
    bare = std::min(bare, NsPerPass(o.calls, [&] { return ucp_worker_progress(w.worker); }));
    ref = std::min(ref, NsPerPass(o.calls, before));
    watched = std::min(watched, NsPerPass(o.calls, named));
  }
  const double added = watched - ref;
  if (o.json) {
    fmt::print(
        "{{\"calls\": {}, \"rounds\": {}, \"bare_progress_ns\": {:.1f}, \"reference_ns\": {:.1f}, "
        "\"watched_ns\": {:.1f}, \"added_ns\": {:.1f}, \"ratio\": {:.3f}}}\n",
        o.calls, o.rounds, bare, ref, watched, added, watched / ref);
  } else {
    fmt::print("progress-step: {} idle ucp_worker_progress calls per round, best of {} rounds\n",
               o.calls, o.rounds);
    fmt::print("  ucp_worker_progress alone              {:8.1f} ns\n", bare);
    fmt::print("  reference: a loop pass, step unnamed   {:8.1f} ns (clock read + progress)\n",
               ref);
    fmt::print("  a loop pass with its step named        {:8.1f} ns\n", watched);
    fmt::print(
        "  added by naming the step               {:8.1f} ns per pass ({:.2f} x the reference)\n",
        added, watched / ref);
  }
  return 0;
}

}  // namespace kvbridge::bench
