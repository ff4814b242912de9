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
  int num_pages = 64;
  // Adjusts each manager's options before it is created.
  std::function<void(ManagerOptions&)> tweak;
  // Wraps each transport (e.g. in a FaultTransport); index = creation order,
  // prefill ranks first.
  std::function<std::unique_ptr<Transport>(std::unique_ptr<Transport>, Role, int)> wrap;
};

class TestCluster {
 public:
  static Result<std::unique_ptr<TestCluster>> Create(const ClusterOptions& options);
  ~TestCluster();

  std::vector<ClusterRank> prefill;
  std::vector<ClusterRank> decode;
  std::unique_ptr<BootstrapServer> server;
  const std::shared_ptr<LoopbackFabric>& fabric() const { return fabric_; }

 private:
  std::shared_ptr<LoopbackFabric> fabric_ = std::make_shared<LoopbackFabric>();
};

// Polls `cond` until it holds or `timeout` passes. Returns whether it held.
bool WaitFor(const std::function<bool()>& cond,
             std::chrono::milliseconds timeout = std::chrono::seconds(30));

}  // namespace kvbridge::internal
