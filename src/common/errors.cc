#include "kvbridge/errors.h"

#include <fmt/format.h>

#include <cmath>

#include "kvbridge/kv_poll.h"

namespace kvbridge {

std::string_view RoleName(Role role) {
  switch (role) {
    case Role::kPrefill:
      return "prefill";
    case Role::kDecode:
      return "decode";
    case Role::kBootstrap:
      return "bootstrap";
  }
  return "unknown";
}

std::string_view KVPollName(KVPoll poll) {
  switch (poll) {
    case KVPoll::kFailed:
      return "Failed";
    case KVPoll::kBootstrapping:
      return "Bootstrapping";
    case KVPoll::kWaitingForInput:
      return "WaitingForInput";
    case KVPoll::kTransferring:
      return "Transferring";
    case KVPoll::kSuccess:
      return "Success";
  }
  return "Unknown";
}

namespace {

struct CauseInfo {
  FailureCause cause;
  std::string_view name;
  StatusCode code;
  std::string_view hint;
};

constexpr CauseInfo kCauses[] = {
    {FailureCause::kPeerExited, "peer_exited", StatusCode::kUnavailable,
     "look at that rank's log and dmesg (OOM killer?), then restart its instance"},
    {FailureCause::kPeerUnreachable, "peer_unreachable", StatusCode::kUnavailable,
     "check the network path and that rank's host; the process may have died"},
    {FailureCause::kPeerUnresponsive, "peer_unresponsive", StatusCode::kUnavailable,
     "that rank is alive but silent (stopped, deadlocked or overloaded): get a stack with "
     "py-spy/gdb, check for SIGSTOP"},
    {FailureCause::kDeadlineExceeded, "deadline_exceeded", StatusCode::kDeadlineExceeded,
     "the peer never advanced this phase: check the peer named here; raise the phase timeout "
     "only if it is merely slow"},
    {FailureCause::kLayoutMismatch, "layout_mismatch", StatusCode::kFailedPrecondition,
     "start prefill and decode with the same model, page size, dtype and a supported tp pair"},
    {FailureCause::kInvalidRequest, "invalid_request", StatusCode::kInvalidArgument,
     "a caller bug: fix the page/aux/state indices or the call order named here"},
    {FailureCause::kAborted, "aborted", StatusCode::kAborted,
     "the request was aborted by the rank named here; nothing to fix unless that was "
     "unexpected"},
    {FailureCause::kLocalError, "local_error", StatusCode::kInternal,
     "read the error text: fix it on that rank (for out of memory lower the memory fraction "
     "or chunk size) and restart it"},
    {FailureCause::kRegistryLost, "registry_lost", StatusCode::kUnavailable,
     "restart the bootstrap server (kvbridge bootstrap) or check its host and port"},
    {FailureCause::kUnauthenticated, "unauthenticated", StatusCode::kUnauthenticated,
     "give every rank the same secret (KVBRIDGE_AUTH_TOKEN or "
     "SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN) and the same kvbridge build; if they have it, "
     "something else answered for that rank: check what serves the port the registry names"},
};

const CauseInfo& Info(FailureCause cause) {
  for (const auto& c : kCauses)
    if (c.cause == cause) return c;
  return kCauses[1];
}

std::string_view CauseVerb(const FailureRecord& r) {
  switch (r.cause) {
    case FailureCause::kPeerExited:
      return "exited";
    case FailureCause::kPeerUnreachable:
      return "became unreachable";
    case FailureCause::kPeerUnresponsive:
      return "stopped responding";
    case FailureCause::kDeadlineExceeded:
      return "exceeded the deadline";
    case FailureCause::kLayoutMismatch:
      return "has an incompatible memory layout";
    case FailureCause::kInvalidRequest:
      return "got an invalid request";
    case FailureCause::kAborted:
      return "aborted the request";
    case FailureCause::kLocalError:
      return "reported a fatal error";
    case FailureCause::kRegistryLost:
      return "lost the bootstrap registry";
    case FailureCause::kUnauthenticated:
      return "could not be authenticated";
  }
  return "failed";
}

}  // namespace

const std::vector<FailureCause>& AllFailureCauses() {
  static const std::vector<FailureCause> all = [] {
    std::vector<FailureCause> v;
    for (const auto& c : kCauses) v.push_back(c.cause);
    return v;
  }();
  return all;
}

std::string_view FailureCauseName(FailureCause cause) { return Info(cause).name; }

bool ParseFailureCause(std::string_view name, FailureCause* cause) {
  for (const auto& c : kCauses) {
    if (c.name == name) {
      *cause = c.cause;
      return true;
    }
  }
  return false;
}

StatusCode FailureCauseCode(FailureCause cause) { return Info(cause).code; }
std::string_view FailureHint(FailureCause cause) { return Info(cause).hint; }

bool IsRankFailure(FailureCause c) {
  return c == FailureCause::kPeerExited || c == FailureCause::kPeerUnreachable ||
         c == FailureCause::kPeerUnresponsive || c == FailureCause::kLocalError;
}

std::string_view PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kBootstrapping:
      return "bootstrapping";
    case Phase::kWaitingForMetadata:
      return "waiting for metadata";
    case Phase::kWaitingForInput:
      return "waiting for input";
    case Phase::kTransferring:
      return "transferring";
    case Phase::kDone:
      return "done";
  }
  return "unknown";
}

std::string RankId::ShortName() const {
  if (role == Role::kBootstrap) return "bootstrap server";
  std::string s(RoleName(role));
  if (!instance.empty()) s += fmt::format("[{}]", instance);
  if (dp != 0) s += fmt::format(" dp{}", dp);
  s += fmt::format(" tp{}", tp);
  if (pp != 0) s += fmt::format(" pp{}", pp);
  if (cp != 0) s += fmt::format(" cp{}", cp);
  return s;
}

std::string RankId::ToString() const {
  if (role == Role::kBootstrap) return fmt::format("bootstrap server {}", host);
  return fmt::format("{} (host {}, pid {})", ShortName(), host.empty() ? "?" : host, pid);
}

bool RankId::SameRank(const RankId& o) const {
  return role == o.role && dp == o.dp && tp == o.tp && pp == o.pp && cp == o.cp &&
         instance == o.instance;
}

std::string FailureRecord::Message() const {
  std::string who = origin.ToString();
  std::string verb(CauseVerb(*this));
  std::string what = detail.empty() ? verb : fmt::format("{} ({})", verb, detail);
  std::string ago;
  const bool self_detected = detected_by.SameRank(origin) && detected_by.pid == origin.pid;
  if (!self_detected && last_sign_of_life.time_since_epoch().count() != 0 &&
      detected_at.time_since_epoch().count() != 0) {
    double s = std::chrono::duration<double>(detected_at - last_sign_of_life).count();
    ago = fmt::format(" (last sign of life {:.1f} s before detection)", std::max(0.0, s));
  }
  std::string by = self_detected ? std::string("itself") : detected_by.ShortName();
  return fmt::format("room {}: {} {}{} during {}; detected by {} via {}; {}.", room, who, what, ago,
                     PhaseName(phase), by, mechanism.empty() ? "unknown" : mechanism,
                     hint.empty() ? std::string(FailureHint(cause)) : hint);
}

}  // namespace kvbridge
