#include "connector/test_cluster.h"

namespace kvbridge::internal {

Result<std::unique_ptr<TestCluster>> TestCluster::Create(const ClusterOptions& o) {
  auto c = std::make_unique<TestCluster>();
  BootstrapServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  ASSIGN_OR_RETURN(c->server, BootstrapServer::Start(so));
  auto make = [&](Role role, int tp_size, int rank, std::vector<ClusterRank>* out) -> Status {
    PoolOptions po;
    po.shape = o.shape;
    po.tp_size = tp_size;
    po.tp_rank = rank;
    po.num_pages = o.num_pages;
    ClusterRank r;
    ASSIGN_OR_RETURN(r.pool, KvPool::Create(po));
    ManagerOptions mo;
    mo.role = role;
    mo.args = r.pool->Args();
    mo.parallel.tp_size = tp_size;
    mo.parallel.tp_rank = rank;
    mo.is_mla = o.shape.mla;
    mo.bootstrap_addr = c->server->address();
    mo.start_bootstrap_server = false;
    if (o.tweak) o.tweak(mo);
    ASSIGN_OR_RETURN(std::unique_ptr<Transport> t,
                     CreateLoopbackTransport(
                         c->fabric_, std::string(RoleName(role)) + " tp" + std::to_string(rank)));
    if (o.wrap) t = o.wrap(std::move(t), role, rank);
    ASSIGN_OR_RETURN(r.manager, CreateManager(mo, std::move(t)));
    out->push_back(std::move(r));
    return Status();
  };
  for (int p = 0; p < o.prefill_tp; ++p)
    RETURN_IF_ERROR(make(Role::kPrefill, o.prefill_tp, p, &c->prefill));
  for (int d = 0; d < o.decode_tp; ++d)
    RETURN_IF_ERROR(make(Role::kDecode, o.decode_tp, d, &c->decode));
  return c;
}

TestCluster::~TestCluster() {
  // Managers first (they talk to the server and each other), pools last.
  for (auto& r : decode) r.manager.reset();
  for (auto& r : prefill) r.manager.reset();
}

bool WaitFor(const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // polling, not synchronisation
  }
  return true;
}

}  // namespace kvbridge::internal
