// What a test may change in how a manager runs (CreateManager in
// api_internal.h): the Clock its core judges time on, whether a ticker
// thread runs its liveness rounds or the test does, one at a time, and what
// /proc says of a process on this host.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/clock.h"
#include "common/process.h"

namespace kvbridge::internal {

struct CoreHooks {
  std::shared_ptr<const Clock> clock;  // null: Clock::System()
  // No ticker, fence or resolver thread: a liveness round (heartbeats,
  // silence checks, phase deadlines), a fence round and a resolver round
  // (lookups, handshake retries) run only when the test calls
  // ManagerImpl::TickNow(); a new receiver that needs lookups is resolved
  // by its Init, on the test's thread. The registry and beat threads run
  // as always.
  bool manual_ticks = false;
  // What /proc says of the process `pid` on this host (null: read /proc).
  // Every same-host judgement of the core asks ManagerImpl::LocalProcessState,
  // which asks this: a test scripts a peer stopped or gone without stopping
  // or killing a process.
  std::function<ProcessState(int pid)> process_state;
  // The boot id this manager declares (unset: its host's). A test places a
  // rank on another machine that has this machine's host name.
  std::optional<std::string> boot_id;
};

}  // namespace kvbridge::internal
