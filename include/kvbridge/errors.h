// FailureRecord: what went wrong with a request, where, and what to do.
//
// Every Failed request carries one. It names the origin rank (role, dp/tp/pp/
// cp, host, pid), the cause from a closed set, the phase, who detected it and
// how, and a one-line hint. Message() is the sentence an operator reads:
//   "room 42: prefill tp1 (host a, pid 1234) exited 0.4 s ago during
//    transferring; detected by decode tp0 via transport error; look at that
//    rank's log and dmesg (OOM killer?)."
// docs/errors.md has an entry for every cause; `kvbridge explain CAUSE`
// prints it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvbridge/export.h"
#include "kvbridge/options.h"
#include "kvbridge/status.h"

namespace kvbridge {

enum class FailureCause {
  kPeerExited,        // the origin process is gone (signal / exit code when known)
  kPeerUnreachable,   // transport error to a live or unknown peer
  kPeerUnresponsive,  // alive but silent: stopped, deadlocked, overloaded
  kDeadlineExceeded,  // a phase ran past its deadline
  kLayoutMismatch,    // prefill and decode memory layouts cannot be matched
  kInvalidRequest,    // bad indices, wrong call order, duplicate receiver
  kAborted,           // the application aborted the request (on some rank)
  kLocalError,        // the application reported a fatal error (e.g. OOM)
  kRegistryLost,      // the bootstrap registry is unreachable
  kUnauthenticated,   // what names a peer did not prove the deployment's secret
};

enum class Phase {
  kBootstrapping,
  kWaitingForMetadata,
  kWaitingForInput,
  kTransferring,
  kDone,
};

// Every cause, for catalogs and tests.
KVB_EXPORT const std::vector<FailureCause>& AllFailureCauses();
// Stable snake_case name, e.g. "peer_exited"; the key of docs/errors.md.
KVB_EXPORT std::string_view FailureCauseName(FailureCause cause);
KVB_EXPORT bool ParseFailureCause(std::string_view name, FailureCause* cause);
KVB_EXPORT std::string_view PhaseName(Phase phase);  // "transferring"
// The status code a cause maps to (peer gone -> Unavailable, ...).
KVB_EXPORT StatusCode FailureCauseCode(FailureCause cause);

// A rank of an instance.
struct KVB_EXPORT RankId {
  Role role = Role::kPrefill;
  int dp = 0;
  int tp = 0;
  int pp = 0;
  int cp = 0;
  std::string host;
  // Its host's /proc/sys/kernel/random/boot_id and, after a '/', its PID
  // namespace ("pid:[4026531836]"); empty when not known (a
  // rank that registered through sglang's protocol). Two ranks are on the
  // same host when host and a known boot_id are both equal.
  std::string boot_id;
  int pid = 0;
  uint64_t incarnation = 0;  // new for every process start
  // Which instance of its role (ManagerOptions::instance_id); empty for a
  // deployment with one instance per role. Part of the position.
  std::string instance;

  // "prefill tp1" (dp/pp/cp shown when non-zero; "decode[b] tp1" for
  // instance "b").
  std::string ShortName() const;
  // "prefill tp1 (host a, pid 1234)".
  std::string ToString() const;
  bool SameRank(const RankId& other) const;  // position, ignoring process
};

struct KVB_EXPORT FailureRecord {
  uint64_t room = 0;
  uint64_t generation = 0;
  RankId origin;
  FailureCause cause = FailureCause::kPeerUnreachable;
  std::string detail;  // "SIGKILL", "CUDA out of memory ...", "UCS_ERR_..."
  Phase phase = Phase::kBootstrapping;
  RankId detected_by;
  std::string mechanism;  // "transport error", "heartbeat", "deadline", ...
  std::chrono::system_clock::time_point detected_at{};
  std::chrono::system_clock::time_point last_sign_of_life{};
  std::string hint;
  bool is_from_another_rank = false;  // origin is not the rank holding it

  StatusCode code() const { return FailureCauseCode(cause); }
  // The one sentence an operator can act on.
  std::string Message() const;
  Status ToStatus() const { return Status(code(), Message()); }
};

// What to do about a cause, one line.
KVB_EXPORT std::string_view FailureHint(FailureCause cause);

// Whether a cause means the origin rank itself failed (so every request
// touching it fails and the registry marks it dead), as opposed to one
// request failing (bad input, abort, deadline, layout) on a healthy rank.
KVB_EXPORT bool IsRankFailure(FailureCause cause);

}  // namespace kvbridge
