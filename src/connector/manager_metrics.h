// Prometheus metrics of one KVManager (names in docs/metrics.md).
#pragma once

#include <functional>
#include <memory>

#include "control/metrics.h"
#include "kvbridge/errors.h"
#include "kvbridge/manager.h"

namespace kvbridge::internal {

class ManagerMetrics {
 public:
  // Serves GET /metrics on `port` (-1: any free port). `stats` is read at
  // scrape time for the gauges.
  static Result<std::unique_ptr<ManagerMetrics>> Start(int port, Role role,
                                                       std::function<ManagerStats()> stats);
  int port() const { return server_->port(); }

  // Lock-free; called by the manager under its own lock.
  void Finished(bool success, double latency_seconds);
  void Failed(FailureCause cause);
  void Wrote(uint64_t bytes, uint64_t ops);
  // A control message dropped because no handshake proved its sender.
  void DroppedUnauthenticated();

 private:
  ManagerMetrics() = default;
  std::shared_ptr<MetricsRegistry> registry_;
  std::unique_ptr<MetricsServer> server_;
  Counter* success_ = nullptr;
  Counter* failed_ = nullptr;
  Counter* bytes_ = nullptr;
  Counter* ops_ = nullptr;
  Counter* unauthenticated_ = nullptr;
  Histogram* latency_ = nullptr;
  std::vector<std::pair<FailureCause, Counter*>> causes_;
};

}  // namespace kvbridge::internal
