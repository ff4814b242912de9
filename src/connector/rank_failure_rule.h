// What a record of a failed rank does on this rank, and which of its
// requests it fails (ManagerImpl::ApplyRankFailureLocked applies it). One
// rule, kept apart from the manager so that it is tested alone: it reads
// the record, the facts it is given (asking the costly ones only when they
// decide) and a room, and does nothing itself.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "connector/rooms.h"
#include "kvbridge/errors.h"

namespace kvbridge::internal {

enum class RankFailureAction {
  kIgnore,     // not a rank's failure, news already applied, or this rank is past it
  kDropStale,  // about a process already replaced: its successor's requests stand
  kFenceSelf,  // others declared this very process failed: fail all, fenced
  kApply,      // fail that peer and the requests it touches
};

struct RankFailureFacts {
  bool about_self = false;           // the record names this rank's position
  bool current_incarnation = false;  // ...and this process's incarnation
  bool this_rank_failed = false;     // this rank reported fatal or is fenced already
  bool applied = false;              // this (rank, incarnation) was applied already
  // Whether a newer incarnation of that rank is known (asked only about
  // another rank's record not applied yet).
  std::function<bool()> replaced;
  // sglang's server: whether this rank failed the detector first (asked
  // only before fencing this rank).
  std::function<bool()> failed_it_first;
};

RankFailureAction JudgeRankFailure(const FailureRecord& record, const RankFailureFacts& facts);

// Whether a rejoin of this rank (`self`: position and pid) keeps `held`, a
// record it applied of another rank's failure (ManagerImpl::dead_ranks_).
// Dropped: what this very process detected (under any incarnation) and did
// not get into the registry; blame gathered while the registry did not
// answer stays local (PublishQueued), as most likely about this rank's own
// isolation, and must not block the new incarnation's requests. Kept: what
// the registry holds, whoever detected it; `published`: the registry holds
// a record of that process's failure (this process put it there, or read
// it back). Every other rank holds that process failed: the rejoined rank
// must not meet it again as healthy until it comes back as a new incarnation.
bool KeptAcrossRejoin(const FailureRecord& held, const RankId& self, bool published);

// The (key, incarnation) of the process whose failure `r` records, when it
// is a rank failure of another rank than `self`: what `published` above
// answers for, once the registry holds `r` (published or read back).
std::optional<std::pair<std::string, uint64_t>> RankFailureOfAnother(
    const FailureRecord& r, const RankId& self, std::string (*key)(const RankId&));

// Whether the failure of the rank at `origin` fails a request here: every
// request when it is a sibling (same group as this rank); on prefill, a
// request with metadata from a decode rank of its instance and dp; on
// decode, an initialized request that reads from its dp (a prefill rank).
bool RankFailureTouches(const RankId& origin, bool sibling, const SenderRoom& room);

// Prefill: whether decode rank `from` takes part in `room`'s request. A
// request is read by one decode instance and dp: the one of its first
// metadata; before any came, any. Metadata or a failure notice from
// another is not about this request and changes nothing in it.
bool OfRoomDecodeGroup(const SenderRoom& room, const RankId& from);
bool RankFailureTouches(const RankId& origin, bool sibling, const ReceiverRoom& room);

}  // namespace kvbridge::internal
