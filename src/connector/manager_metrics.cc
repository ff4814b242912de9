#include "connector/manager_metrics.h"

namespace kvbridge::internal {

Result<std::unique_ptr<ManagerMetrics>> ManagerMetrics::Start(int port, Role role,
                                                              std::function<ManagerStats()> stats) {
  std::unique_ptr<ManagerMetrics> m(new ManagerMetrics());
  m->registry_ = std::make_shared<MetricsRegistry>();
  MetricsRegistry& r = *m->registry_;
  const std::string role_name(RoleName(role));
  const char* kFinished = "Requests (rooms) finished";
  KVB_ASSIGN_OR_RETURN(m->success_, r.GetCounter("kvbridge_transfers_total", kFinished,
                                                 {{"role", role_name}, {"result", "success"}}));
  KVB_ASSIGN_OR_RETURN(m->failed_, r.GetCounter("kvbridge_transfers_total", kFinished,
                                                {{"role", role_name}, {"result", "failed"}}));
  KVB_ASSIGN_OR_RETURN(
      m->bytes_, r.GetCounter("kvbridge_transfer_bytes_total",
                              "KV payload bytes written and completed", {{"role", role_name}}));
  KVB_ASSIGN_OR_RETURN(m->ops_, r.GetCounter("kvbridge_transfer_write_ops_total",
                                             "Coalesced writes posted", {{"role", role_name}}));
  KVB_ASSIGN_OR_RETURN(
      m->unauthenticated_,
      r.GetCounter("kvbridge_unauthenticated_messages_total",
                   "Control messages dropped because no handshake proved their sender",
                   {{"role", role_name}}));
  KVB_ASSIGN_OR_RETURN(m->latency_,
                       r.GetHistogram("kvbridge_request_latency_seconds",
                                      "Request latency from creation to a terminal state",
                                      LatencyBuckets(), {{"role", role_name}}));
  for (FailureCause c : AllFailureCauses()) {
    KVB_ASSIGN_OR_RETURN(Counter * counter,
                         r.GetCounter("kvbridge_failures_total", "Failed requests by cause",
                                      {{"cause", std::string(FailureCauseName(c))}}));
    m->causes_.emplace_back(c, counter);
  }
  Gauge* peers = nullptr;
  KVB_ASSIGN_OR_RETURN(
      peers, r.GetGauge("kvbridge_peers", "Peers this rank talks to", {{"state", "connected"}}));
  std::vector<std::pair<const char*, Gauge*>> rooms;
  for (const char* state : {"bootstrapping", "waiting", "transferring"}) {
    KVB_ASSIGN_OR_RETURN(
        Gauge * g, r.GetGauge("kvbridge_rooms", "Live requests in each state", {{"state", state}}));
    rooms.emplace_back(state, g);
  }
  r.AddCollector([stats, peers, rooms] {
    ManagerStats s = stats();
    peers->Set(static_cast<double>(s.peers_connected));
    rooms[0].second->Set(static_cast<double>(s.rooms_bootstrapping));
    rooms[1].second->Set(static_cast<double>(s.rooms_waiting));
    rooms[2].second->Set(static_cast<double>(s.rooms_transferring));
  });
  KVB_ASSIGN_OR_RETURN(m->server_, MetricsServer::Start(port < 0 ? 0 : port, m->registry_));
  return m;
}

void ManagerMetrics::Finished(bool success, double latency_seconds) {
  (success ? success_ : failed_)->Increment();
  latency_->Observe(latency_seconds);
}

void ManagerMetrics::Failed(FailureCause cause) {
  for (auto& [c, counter] : causes_)
    if (c == cause) counter->Increment();
}

void ManagerMetrics::DroppedUnauthenticated() { unauthenticated_->Increment(); }

void ManagerMetrics::Wrote(uint64_t bytes, uint64_t ops) {
  bytes_->Increment(static_cast<double>(bytes));
  ops_->Increment(static_cast<double>(ops));
}

}  // namespace kvbridge::internal
