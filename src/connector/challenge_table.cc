#include "connector/challenge_table.h"

#include <chrono>

namespace kvbridge::internal {

ChallengeTable::Kept ChallengeTable::Keep(uint64_t session, const RankId& from, PeerId tpeer,
                                          SteadyTime now) {
  Kept out;
  LetGoExpired(now, out);
  // The same Hello again (replayed): the same challenge, which goes out on
  // the new endpoint.
  if (auto same = endpoints_.find(session); same != endpoints_.end()) {
    LetGo(same->second.tpeer, now, out);
    endpoints_.erase(same);
  }
  while (endpoints_.size() >= kMaxEndpoints) {
    auto oldest = endpoints_.begin();
    for (auto it = endpoints_.begin(); it != endpoints_.end(); ++it)
      if (it->second.at < oldest->second.at) oldest = it;
    LetGo(oldest->second.tpeer, now, out);
    endpoints_.erase(oldest);
  }
  for (const auto& [s, earlier] : endpoints_) {
    if (!SameProcess(earlier.from, from)) continue;
    out.again_after_s = std::chrono::duration<double>(now - earlier.at).count();
    break;
  }
  endpoints_[session] = {from, tpeer, now};
  return out;
}

void ChallengeTable::LetGo(PeerId tpeer, SteadyTime now, Kept& out) {
  closing_.emplace_back(tpeer, now);
  if (closing_.size() <= kMaxClosing) return;
  out.close_now.push_back(closing_.front().first);
  closing_.pop_front();
}

void ChallengeTable::LetGoExpired(SteadyTime now, Kept& out) {
  for (auto it = endpoints_.begin(); it != endpoints_.end();) {
    if (now - it->second.at <= kLifetime) {
      ++it;
      continue;
    }
    LetGo(it->second.tpeer, now, out);
    it = endpoints_.erase(it);
  }
}

std::vector<PeerId> ChallengeTable::Due(SteadyTime now) {
  Kept expired;  // close_now: past kMaxClosing waiting
  LetGoExpired(now, expired);
  std::vector<PeerId> due = std::move(expired.close_now);
  while (!closing_.empty() && now - closing_.front().second >= kCloseDelay) {
    due.push_back(closing_.front().first);
    closing_.pop_front();
  }
  return due;
}

bool ChallengeTable::FirstProof(uint64_t session, SteadyTime now) {
  for (auto it = proven_.begin(); it != proven_.end();) {
    if (now - it->second > kLifetime) {
      it = proven_.erase(it);
    } else {
      ++it;
    }
  }
  return proven_.emplace(session, now).second;
}

std::optional<PeerId> ChallengeTable::TakeEndpoint(uint64_t session, const RankId& from) {
  auto it = endpoints_.find(session);
  if (it == endpoints_.end() || !SameProcess(it->second.from, from)) return std::nullopt;
  const PeerId tpeer = it->second.tpeer;
  endpoints_.erase(it);
  return tpeer;
}

std::optional<RankId> ChallengeTable::Forget(PeerId tpeer) {
  for (auto it = endpoints_.begin(); it != endpoints_.end(); ++it) {
    if (it->second.tpeer != tpeer) continue;
    RankId from = it->second.from;
    endpoints_.erase(it);
    return from;
  }
  return std::nullopt;
}

std::vector<PeerId> ChallengeTable::Clear() {
  std::vector<PeerId> all;
  for (const auto& [session, e] : endpoints_) all.push_back(e.tpeer);
  for (const auto& [tpeer, at] : closing_) all.push_back(tpeer);
  endpoints_.clear();
  closing_.clear();
  return all;
}

}  // namespace kvbridge::internal
