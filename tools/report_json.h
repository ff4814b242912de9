// JSON forms of ranks, failure records and worker reports (CLI output, the
// demo's summary, and what the multi-process tests parse).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "kvbridge/errors.h"
#include "kvbridge/manager.h"

namespace kvbridge::tools {

// internal::RankIdToJson.
nlohmann::json RankToJson(const RankId& rank);
// internal::FailureRecordToJson plus "silence_s" (detected_at minus
// last_sign_of_life, in seconds).
nlohmann::json FailureToJson(const FailureRecord& record);
nlohmann::json StatsToJson(const ManagerStats& stats);

struct RoomOutcome {
  uint64_t room = 0;
  bool success = false;
  double latency_us = 0;
  int64_t finished_at_us = 0;  // wall clock, µs since the epoch
  // On the heap: a record inline is ~400 bytes, and a run of 10,000 rooms in
  // flight that kept one per outcome counted them in its bytes per room.
  std::shared_ptr<const FailureRecord> failure;
};

struct WorkerReport {
  int requests = 0;
  std::vector<RoomOutcome> outcomes;
  uint64_t nonterminal = 0;  // rooms never finished before the deadline
  uint64_t unquiesced = 0;   // failed rooms whose pages never quiesced
  uint64_t skipped = 0;      // requests of the plan never admitted ("skip K")
  uint64_t verified_pages = 0;
  uint64_t corrupt_pages = 0;
  uint64_t bytes = 0;
  bool fatal_reported = false;
  ManagerStats stats;        // before rooms were released
  ManagerStats stats_after;  // after: rooms_live must be 0
};

nlohmann::json ReportToJson(const RankId& self, const WorkerReport& report);

}  // namespace kvbridge::tools
