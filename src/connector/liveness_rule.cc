#include "connector/liveness_rule.h"

#include <fmt/format.h>

#include "control/auth.h"
#include "kvbridge/errors.h"

namespace kvbridge::internal {

namespace {

double Seconds(std::chrono::nanoseconds d) { return std::chrono::duration<double>(d).count(); }

// Why a handshake is given up: the attempts, and what came that did not do.
std::string UnansweredHandshake(const Peer& peer, SteadyTime now) {
  std::string detail = fmt::format("no answer to {} handshake attempts in {:.2f} s",
                                   peer.hello_attempts, Seconds(now - peer.last_heard));
  if (peer.proofs_sent > 0)
    detail += fmt::format("; challenges that checked and whose proof got no answer: {}",
                          peer.proofs_sent);
  if (peer.late_challenges > 0)
    detail += fmt::format("; challenges that came too late for the attempt they answered: {}",
                          peer.late_challenges);
  if (peer.auth_refusals > 0)
    detail += fmt::format(
        "; {} answers claiming to be it did not prove the shared secret (set {} to the same secret "
        "on every rank)",
        peer.auth_refusals, kAuthTokenEnv);
  return detail;
}

LivenessVerdict Blame(std::string silence, const char* mechanism, ProcessState ps) {
  LivenessVerdict v;
  v.kind = LivenessVerdict::Kind::kBlame;
  v.silence = std::move(silence);
  v.mechanism = mechanism;
  v.process = ps;
  return v;
}

// A peer whose handshake is not answered: a lost Hello is sent again on a
// new endpoint, after two silence limits and then four (across hosts a lost
// SYN alone costs 1 s: a retry at one limit raced the first answer), before
// the rank is blamed (Peer::kHandshakeBudget limits since it was last
// heard, Peer::kMaxHelloAttempts Hellos, or at once when /proc says it
// exited).
LivenessVerdict JudgeHandshake(const Peer& peer, SteadyTime now,
                               std::chrono::microseconds silence_limit,
                               const std::function<ProcessState()>& process_state) {
  const auto wait = silence_limit * (peer.hello_attempts <= 1 ? 2 : 4);
  if (now - peer.hello_at <= wait) return {};
  const ProcessState ps = process_state();
  if (ps == ProcessState::kExited ||
      now - peer.last_heard > silence_limit * Peer::kHandshakeBudget ||
      peer.hello_attempts >= Peer::kMaxHelloAttempts)
    return Blame(UnansweredHandshake(peer, now), "handshake", ps);
  LivenessVerdict v;
  v.kind = LivenessVerdict::Kind::kRetryHello;
  return v;
}

}  // namespace

LivenessVerdict JudgeLiveness(const Peer& peer, SteadyTime now,
                              std::chrono::microseconds silence_limit, bool this_rank_failed,
                              const std::function<ProcessState()>& process_state) {
  if (peer.tpeer == 0) return {};  // no endpoint yet: nothing to send, nothing heard
  // Nothing goes to a rank before its handshake proved it (peer_auth.h).
  const bool beat =
      peer.acked &&
      (!peer.failed || (peer.failure && peer.failure->cause == FailureCause::kLocalError));
  LivenessVerdict v;
  if (peer.failed || !peer.ready || this_rank_failed) {
    v.beat = beat;
    return v;
  }
  if (!peer.acked) return JudgeHandshake(peer, now, silence_limit, process_state);
  // Silent since our answer: the peer may not have it yet (it sends its
  // Hello again), and gets the handshake's budget (Peer::heard_since_ready).
  const auto limit =
      peer.heard_since_ready ? silence_limit : silence_limit * Peer::kHandshakeBudget;
  const auto silent = now - peer.last_heard;
  if (silent > limit) {
    const ProcessState ps = process_state();
    // On this host /proc tells the truth: a running peer whose heartbeats
    // queue behind bulk data is busy, not failed. Only a much longer silence
    // (a deadlock) makes it unresponsive.
    if (ps != ProcessState::kRunning || silent > silence_limit * 10) {
      v = Blame(fmt::format("silent for {:.2f} s{}", Seconds(silent),
                            peer.heard_since_ready ? "" : " since the handshake"),
                peer.heard_since_ready ? "heartbeat" : "handshake", ps);
    }
  }
  v.beat = beat;
  return v;
}

}  // namespace kvbridge::internal
