#include "connector/deadline_rule.h"

#include <fmt/format.h>

#include <string_view>

namespace kvbridge::internal {

namespace {

double Seconds(std::chrono::nanoseconds d) { return std::chrono::duration<double>(d).count(); }

// A peer's sentence, to be followed by more of ours.
std::string_view NoFinalStop(std::string_view words) {
  while (!words.empty() && words.back() == '.') words.remove_suffix(1);
  return words;
}

DeadlineBreach Breach(std::optional<RankId> origin, std::string detail, Phase phase) {
  DeadlineBreach b;
  b.origin = std::move(origin);
  b.detail = std::move(detail);
  b.phase = phase;
  return b;
}

}  // namespace

std::optional<RankId> SilentDecodeRank(const SenderRoom& room, int decode_tp,
                                       const std::vector<RankId>& met_decode) {
  // Decode tp ranks are expected once the first metadata came: its rank
  // names the group (instance, dp, stage) that holds this request.
  if (room.flows.empty()) return std::nullopt;
  const RankId& group = room.flows.begin()->second.decode;
  for (const RankId& id : met_decode)
    if (id.role == Role::kDecode && id.tp == decode_tp && id.instance == group.instance &&
        id.dp == group.dp && id.pp == group.pp)
      return id;
  return std::nullopt;
}

std::optional<DeadlineBreach> SenderDeadline(const SenderRoom& room, SteadyTime now,
                                             const PhaseTimeouts& timeouts,
                                             const std::vector<RankId>& met_decode) {
  const auto elapsed = now - room.phase_since;
  if (room.inflight > 0) {
    if (elapsed <= timeouts.transfer) return std::nullopt;
    for (const auto& [rank, flow] : room.flows) {
      if (flow.inflight == 0) continue;
      DeadlineBreach b = Breach(flow.decode,
                                fmt::format("writes to {} not completed within {:.1f} s",
                                            flow.decode.ShortName(), Seconds(timeouts.transfer)),
                                Phase::kTransferring);
      b.mechanism = "transfer deadline";
      b.generation = flow.meta.generation;
      return b;
    }
    return std::nullopt;
  }
  if (elapsed <= timeouts.waiting) return std::nullopt;
  std::string what = "the application sent no chunk";
  Phase phase = room.phase;
  std::optional<RankId> origin;
  if (room.poll() == KVPoll::kBootstrapping) {
    phase = Phase::kWaitingForMetadata;
    std::string missing;
    for (int d : room.expected_decode) {
      if (room.flows.count(d)) continue;
      missing += fmt::format(" tp{}", d);
      if (!origin) origin = SilentDecodeRank(room, d, met_decode);
    }
    what = missing.empty() ? "no decode rank sent metadata" : "no metadata from decode" + missing;
  }
  std::string detail = fmt::format("{} within {:.1f} s", what, Seconds(timeouts.waiting));
  return Breach(std::move(origin), std::move(detail), phase);
}

namespace {

// The first source whose handshake is pending, a refused one first (it
// names this process, whichever source refused); none: all completed.
std::optional<DeadlineBreach> PendingHandshakeBreach(
    const ReceiverRoom& room, std::chrono::nanoseconds elapsed,
    const std::function<std::optional<PendingHandshake>(const ReceiverSource&)>& pending) {
  const ReceiverSource* unanswered = nullptr;
  for (const ReceiverSource& src : room.sources) {
    const std::optional<PendingHandshake> h = pending(src);
    if (!h) continue;
    if (h->refusals == 0) {
      if (unanswered == nullptr) unanswered = &src;
      continue;
    }
    return Breach(std::nullopt,
                  fmt::format("{} refused this process's handshake {} times in {:.1f} s: {}; "
                              "no registry told this process so, and it has not fenced "
                              "itself: restart it",
                              src.prefill->ShortName(), h->refusals, Seconds(elapsed),
                              NoFinalStop(h->refusal)),
                  Phase::kBootstrapping);
  }
  if (unanswered == nullptr) return std::nullopt;
  return Breach(unanswered->prefill.get(),
                fmt::format("handshake with {} not completed in {:.1f} s",
                            unanswered->prefill->ShortName(), Seconds(elapsed)),
                Phase::kBootstrapping);
}

}  // namespace

std::optional<DeadlineBreach> ReceiverDeadline(
    const ReceiverRoom& room, SteadyTime now, const PhaseTimeouts& timeouts,
    const std::function<std::optional<PendingHandshake>(const ReceiverSource&)>& pending) {
  const auto elapsed = now - room.phase_since;
  if (elapsed <= timeouts.waiting) return std::nullopt;
  // A handshake still pending holds the request whatever else it waits
  // for (metadata given first, in kvbridge's own order, waits on it too).
  if (auto b = PendingHandshakeBreach(room, elapsed, pending)) return b;
  if (!room.meta_given)
    return Breach(std::nullopt, "the application did not call SendMetadata",
                  Phase::kWaitingForMetadata);
  for (const ReceiverSource& src : room.sources) {
    if (src.dummy || src.last_received) continue;
    return Breach(
        src.prefill.get(),
        fmt::format("no chunk from {} for {:.1f} s", src.prefill->ShortName(), Seconds(elapsed)),
        room.phase);
  }
  return std::nullopt;
}

}  // namespace kvbridge::internal
