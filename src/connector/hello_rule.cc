#include "connector/hello_rule.h"

#include <fmt/format.h>

#include <utility>

#include "connector/peer_auth.h"

namespace kvbridge::internal {

namespace {

OldPeerFate FateOfHeldPeer(const OldPeerFacts& f) {
  if (!f.exists) return OldPeerFate::kNone;
  // A peer this rank retired when it rejoined is replaced like a restarted
  // one: the new session is this incarnation's.
  if (!f.same_incarnation || !f.ready || f.retired) return OldPeerFate::kReplacedRestarted;
  if (f.failed) return f.failure_notice ? OldPeerFate::kTakesNewSession : OldPeerFate::kStaysFailed;
  return f.flows_use_it ? OldPeerFate::kAnsweredAgain : OldPeerFate::kReplaced;
}

}  // namespace

OldPeerFate FateOfOldPeer(const OldPeerFacts& f) {
  const OldPeerFate fate = FateOfHeldPeer(f);
  // Where the Hello would make a new peer, a declared-failed process is told instead.
  if (f.declared_dead && !KeepsOldPeer(fate)) return OldPeerFate::kToldItFailed;
  return fate;
}

bool KeepsOldPeer(OldPeerFate fate) {
  return fate == OldPeerFate::kStaysFailed || fate == OldPeerFate::kTakesNewSession ||
         fate == OldPeerFate::kAnsweredAgain || fate == OldPeerFate::kToldItFailed;
}

bool TakesRefusal(bool acked, int refused_attempt, int hello_attempts) {
  return !acked && refused_attempt != hello_attempts;
}

void KeepHello(std::vector<SentHello>& kept, SentHello sent) {
  if (!kept.empty() && kept.back().address != sent.address) kept.clear();
  if (kept.size() >= kHellosKept) kept.erase(kept.begin(), kept.end() - (kHellosKept - 1));
  kept.push_back(std::move(sent));
}

SentHello* HelloAnswered(std::vector<SentHello>& kept, uint64_t session) {
  if (session == 0) return nullptr;
  for (SentHello& h : kept)
    if (h.session == session) return &h;
  return nullptr;
}

std::string NewIncarnationDetail(const RankId& old, const RankId& now) {
  if (SameProcess(HostOf(old), HostOf(now)))
    return fmt::format("rejoined as incarnation {:#x} (same process)", now.incarnation);
  return fmt::format("restarted as pid {}", now.pid);
}

}  // namespace kvbridge::internal
