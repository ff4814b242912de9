#include "tools/report_json.h"

#include <algorithm>
#include <chrono>

#include "control/record_json.h"

namespace kvbridge::tools {

// The connector's forms (what the registry stores) plus the CLI's extras, so
// a field added there shows up here too.
nlohmann::json RankToJson(const RankId& r) { return internal::RankIdToJson(r); }

nlohmann::json FailureToJson(const FailureRecord& f) {
  nlohmann::json j = internal::FailureRecordToJson(f);
  // Seconds between the last sign of life and detection; Python exposes it
  // as KVTransferError.silence_s.
  j["silence_s"] = std::chrono::duration<double>(f.detected_at - f.last_sign_of_life).count();
  return j;
}

nlohmann::json StatsToJson(const ManagerStats& s) {
  return {{"rooms_live", s.rooms_live},
          {"rooms_bootstrapping", s.rooms_bootstrapping},
          {"rooms_waiting", s.rooms_waiting},
          {"rooms_transferring", s.rooms_transferring},
          {"rooms_succeeded", s.rooms_succeeded},
          {"rooms_failed", s.rooms_failed},
          {"bytes_written", s.bytes_written},
          {"write_ops", s.write_ops},
          {"chunks_sent", s.chunks_sent},
          {"stale_messages_dropped", s.stale_messages_dropped},
          {"rejoins", s.rejoins},
          {"invalid_messages_dropped", s.invalid_messages_dropped},
          {"unauthenticated_messages_dropped", s.unauthenticated_messages_dropped},
          {"pending_metadata", s.pending_metadata},
          {"rooms_awaiting_restart_check", s.rooms_awaiting_restart_check},
          {"peers_connected", s.peers_connected},
          {"heartbeat_rounds", s.heartbeat_rounds},
          {"failure_records_unpublished", s.failure_records_unpublished}};
}

nlohmann::json ReportToJson(const RankId& self, const WorkerReport& r) {
  std::vector<double> lat;
  nlohmann::json failures = nlohmann::json::array();
  uint64_t ok = 0;
  std::vector<int64_t> succeeded_at;
  for (const RoomOutcome& o : r.outcomes) {
    if (o.success) {
      ++ok;
      lat.push_back(o.latency_us);
      succeeded_at.push_back(o.finished_at_us);
    } else if (o.failure) {
      failures.push_back(FailureToJson(*o.failure));
    } else {
      failures.push_back({{"room", o.room}, {"cause", "unknown"}, {"message", "no record"}});
    }
  }
  std::sort(lat.begin(), lat.end());
  auto pct = [&](double p) {
    return lat.empty() ? 0.0 : lat[std::min(lat.size() - 1, static_cast<size_t>(p * lat.size()))];
  };
  return {{"rank", RankToJson(self)},
          {"requests", r.requests},
          {"finished", r.outcomes.size()},
          {"succeeded", ok},
          {"failed", r.outcomes.size() - ok},
          {"nonterminal", r.nonterminal},
          {"unquiesced", r.unquiesced},
          {"skipped", r.skipped},
          // When each success finished (wall µs): what a fault test times
          // recovery by.
          {"succeeded_at_us", succeeded_at},
          {"verified_pages", r.verified_pages},
          {"corrupt_pages", r.corrupt_pages},
          {"bytes", r.bytes},
          {"p50_us", pct(0.5)},
          {"p99_us", pct(0.99)},
          {"max_us", lat.empty() ? 0.0 : lat.back()},
          {"fatal_reported", r.fatal_reported},
          {"failures", failures},
          {"stats", StatsToJson(r.stats)},
          {"stats_after", StatsToJson(r.stats_after)}};
}

}  // namespace kvbridge::tools
