#include "connector/sender_inbox.h"

#include <climits>

namespace kvbridge::internal {

void ClosedFlows::Note(uint64_t room, int decode_tp, uint64_t generation) {
  auto [it, added] = last_.insert_or_assign({room, decode_tp}, generation);
  if (!added) return;
  order_.push_back(it->first);
  if (order_.size() <= limit_) return;
  last_.erase(order_.front());
  order_.pop_front();
}

bool ClosedFlows::Holds(uint64_t room, int decode_tp, uint64_t generation) const {
  auto it = last_.find({room, decode_tp});
  return it != last_.end() && it->second == generation;
}

SenderInbox::MetaVerdict SenderInbox::OnMetaWithoutSender(MetaMsg meta, const RankId& from,
                                                          SteadyTime now) {
  const Key key{meta.room, from.tp};
  auto kept = failures_.find(meta.room);
  if (kept != failures_.end()) {
    auto known = kept->second.generations.find(from.tp);
    // A new request from a rank whose old one the failure was about: the
    // room is in use again; its sender has not been created yet.
    if (known != kept->second.generations.end() && known->second != meta.generation) {
      failures_.erase(kept);
      kept = failures_.end();
    }
  }
  if (kept != failures_.end()) {
    // This request's sender already failed (before its metadata came).
    MetaVerdict v{MetaVerdict::kAnswerFailed, kept->second.record};
    v.record.generation = meta.generation;
    return v;
  }
  auto abort = aborts_.find(key);
  if (abort != aborts_.end() && abort->second.generation == meta.generation) {
    // Decode failed this very request and its notice overtook the metadata:
    // nothing may be written; the sender, when it comes, fails with it.
    return {MetaVerdict::kAnswerFailed, abort->second.record};
  }
  // A newer use of the room by that decode rank supersedes an old abort.
  if (abort != aborts_.end()) aborts_.erase(abort);
  if (!Fits(key, meta)) return {MetaVerdict::kOverLimit, {}};
  Put(key, PendingMeta{std::move(meta), from, now});
  return {MetaVerdict::kHeld, {}};
}

bool SenderInbox::HoldForNextSender(MetaMsg meta, const RankId& from, SteadyTime now) {
  const Key key{meta.room, from.tp};
  if (!Fits(key, meta)) return false;
  Put(key, PendingMeta{std::move(meta), from, now});
  return true;
}

bool SenderInbox::Fits(const Key& key, const MetaMsg& meta) const {
  auto same = meta_.find(key);
  const size_t replaced = same == meta_.end() ? 0 : Entries(same->second.meta);
  return (meta_.size() < max_pending_ || same != meta_.end()) &&
         entries_ - replaced + Entries(meta) <= max_entries_;
}

void SenderInbox::Put(const Key& key, PendingMeta held) {
  auto [it, added] = meta_.try_emplace(key);
  if (!added) entries_ -= Entries(it->second.meta);
  entries_ += Entries(held.meta);
  it->second = std::move(held);
}

SenderInbox::Held::iterator SenderInbox::Erase(Held::iterator it) {
  entries_ -= Entries(it->second.meta);
  return meta_.erase(it);
}

std::optional<FailureRecord> SenderInbox::TakeAbortFor(uint64_t room, int decode_tp,
                                                       uint64_t generation) {
  auto abort = aborts_.find({room, decode_tp});
  if (abort == aborts_.end()) return std::nullopt;
  // Same generation: decode failed this request before its metadata got
  // here. Another: an older use's late notice, superseded by this metadata.
  std::optional<FailureRecord> r;
  if (abort->second.generation == generation) r = std::move(abort->second.record);
  aborts_.erase(abort);
  return r;
}

bool SenderInbox::OnNoticeWithoutFlow(uint64_t room, int decode_tp, uint64_t generation,
                                      const FailureRecord& record, SteadyTime now) {
  // About a request a released sender served: nothing of it is in flight.
  if (closed_.Holds(room, decode_tp, generation)) return true;
  const Key key{room, decode_tp};
  auto held = meta_.find(key);
  if (held != meta_.end() && held->second.meta.generation == generation) Erase(held);
  // Kept even when a live sender exists: the notice may have overtaken its
  // request's metadata (sent by another decode thread just before), which
  // must then not be adopted. Bounded as metadata: past the limit a notice
  // is not kept (the sender, if it comes, then waits for its deadline).
  if (aborts_.size() < max_pending_ || aborts_.count(key))
    aborts_[key] = PendingAbort{record, generation, now};
  return false;
}

SenderInbox::ForNewSender SenderInbox::TakeForNewSender(uint64_t room) {
  ForNewSender out;
  failures_.erase(room);  // a new use of the room
  for (auto a = aborts_.lower_bound({room, INT_MIN});
       a != aborts_.end() && a->first.first == room;) {
    out.aborts.emplace_back(a->first.second, std::move(a->second));
    a = aborts_.erase(a);
  }
  for (auto m = meta_.lower_bound({room, INT_MIN}); m != meta_.end() && m->first.first == room;) {
    entries_ -= Entries(m->second.meta);
    out.metas.push_back(std::move(m->second));
    m = meta_.erase(m);
  }
  return out;
}

void SenderInbox::OnSenderReleased(uint64_t room,
                                   const std::vector<std::pair<int, uint64_t>>& flows,
                                   const FailureRecord* failure,
                                   const std::map<int, uint64_t>& aborted, SteadyTime now) {
  for (const auto& [tp, generation] : flows) closed_.Note(room, tp, generation);
  if (failure != nullptr) failures_[room] = KeptFailure{*failure, aborted, now};
}

void SenderInbox::Expire(SteadyTime now, std::chrono::steady_clock::duration max_age) {
  auto old = [&](SteadyTime at) { return now - at > max_age; };
  for (auto m = meta_.begin(); m != meta_.end();) m = old(m->second.at) ? Erase(m) : ++m;
  for (auto f = failures_.begin(); f != failures_.end();)
    f = old(f->second.at) ? failures_.erase(f) : ++f;
  for (auto a = aborts_.begin(); a != aborts_.end();)
    a = old(a->second.at) ? aborts_.erase(a) : ++a;
}

void SenderInbox::DropMetaIf(const std::function<bool(const RankId&)>& from_peer) {
  for (auto m = meta_.begin(); m != meta_.end();) m = from_peer(m->second.from) ? Erase(m) : ++m;
}

}  // namespace kvbridge::internal
