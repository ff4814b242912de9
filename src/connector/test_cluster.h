// In-process clusters of prefill and decode managers over the loopback
// transport, for the connector's unit tests.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "connector/api_internal.h"
#include "connector/kv_pool.h"
#include "connector/sglang_standin.h"
#include "kvbridge/bootstrap.h"
#include "kvbridge/manager.h"
#include "kvbridge/receiver.h"
#include "kvbridge/sender.h"
#include "transport/loopback/loopback_transport.h"

namespace kvbridge::internal {

struct ClusterRank {
  std::unique_ptr<KvPool> pool;
  std::unique_ptr<KVManager> manager;
};

struct ClusterOptions {
  ModelShape shape{.layers = 2,
                   .total_kv_heads = 4,
                   .head_dim = 8,
                   .dtype_bytes = 2,
                   .page_size = 4,
                   .mla = false,
                   .aux_item_len = 32,
                   .state_item_len = 16};
  int prefill_tp = 1;
  int decode_tp = 1;
  // Pipeline stages: every (pp, tp) rank is created, with
  // ParallelLayout::pp_size/pp_rank set and its pool holding that stage's
  // layers (LayersOfStage: sglang's split of shape.layers).
  int prefill_pp = 1;
  int decode_pp = 1;
  int num_pages = 64;
  // Adjusts each manager's options before it is created.
  std::function<void(ManagerOptions&)> tweak;
  // Wraps each transport (e.g. in a FaultTransport); the int is the rank's
  // index in TestCluster::prefill or ::decode (its tp rank when pp is 1).
  std::function<std::unique_ptr<Transport>(std::unique_ptr<Transport>, Role, int)> wrap;
  // The registry is a stand-in for sglang's own bootstrap server
  // (sglang_standin.h: no liveness, no failure records) instead of kvbridge's.
  bool sglang_server = false;
  // The address the managers reach the registry at, given the server's (e.g.
  // a StallProxy's in front of it); the server's own when unset.
  std::function<std::string(const std::string&)> bootstrap_via;
  // Every manager's clock and ticking (core_hooks.h); one clock may be shared.
  CoreHooks hooks;
  // Adjusts `hooks` for one rank (same arguments as `wrap`).
  std::function<void(CoreHooks&, Role, int)> tweak_hooks;
};

class TestCluster {
 public:
  static Result<std::unique_ptr<TestCluster>> Create(const ClusterOptions& options);
  ~TestCluster();

  // pp-major: rank (pp_rank, tp_rank) is at index pp_rank * tp + tp_rank, so
  // with pp 1 the index is the tp rank.
  std::vector<ClusterRank> prefill;
  std::vector<ClusterRank> decode;
  ClusterRank& prefill_at(int pp_rank, int tp_rank) {
    return prefill.at(pp_rank * prefill_tp_ + tp_rank);
  }
  ClusterRank& decode_at(int pp_rank, int tp_rank) {
    return decode.at(pp_rank * decode_tp_ + tp_rank);
  }
  int prefill_pp() const { return static_cast<int>(prefill.size()) / prefill_tp_; }
  int decode_pp() const { return static_cast<int>(decode.size()) / decode_tp_; }
  std::unique_ptr<BootstrapServer> server;  // null with ClusterOptions::sglang_server
  std::unique_ptr<SglangStandinServer> sglang_server;
  std::string bootstrap_address() const {
    return server ? server->address() : sglang_server->address();
  }
  const std::shared_ptr<LoopbackFabric>& fabric() const { return fabric_; }

 private:
  std::shared_ptr<LoopbackFabric> fabric_ = std::make_shared<LoopbackFabric>();
  int prefill_tp_ = 1;
  int decode_tp_ = 1;
};

// Heartbeats every 50 ms with 40 misses allowed: failures are detected by
// the mechanism a test aims at, with no false alarms on a loaded machine.
void TolerantLiveness(ManagerOptions& m);

// Polls `cond` until it holds or `timeout` passes. Returns whether it held.
bool WaitFor(const std::function<bool()>& cond,
             std::chrono::milliseconds timeout = std::chrono::seconds(30));

}  // namespace kvbridge::internal
