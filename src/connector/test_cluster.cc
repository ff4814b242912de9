#include "connector/test_cluster.h"

namespace kvbridge::internal {

Result<std::unique_ptr<TestCluster>> TestCluster::Create(const ClusterOptions& o) {
  auto c = std::make_unique<TestCluster>();
  if (o.sglang_server) {
    KVB_ASSIGN_OR_RETURN(c->sglang_server, SglangStandinServer::Start());
  } else {
    BootstrapServerOptions so;
    so.host = "127.0.0.1";
    so.port = 0;
    KVB_ASSIGN_OR_RETURN(c->server, BootstrapServer::Start(so));
  }
  if (o.prefill_pp < 1 || o.decode_pp < 1 || o.prefill_tp < 1 || o.decode_tp < 1)
    return InvalidArgumentError("cluster sizes must be >= 1");
  c->prefill_tp_ = o.prefill_tp;
  c->decode_tp_ = o.decode_tp;
  auto make = [&](Role role, int tp_size, int pp_size, int index,
                  std::vector<ClusterRank>* out) -> Status {
    const int tp_rank = index % tp_size;
    const int pp_rank = index / tp_size;
    const LayerRange layers = LayersOfStage(o.shape.layers, pp_size, pp_rank);
    PoolOptions po;
    po.shape = o.shape;
    po.tp_size = tp_size;
    po.tp_rank = tp_rank;
    po.first_layer = layers.first;
    po.num_layers = layers.count;
    po.num_pages = o.num_pages;
    ClusterRank r;
    KVB_ASSIGN_OR_RETURN(r.pool, KvPool::Create(po));
    ManagerOptions mo;
    mo.role = role;
    mo.args = r.pool->Args();
    mo.parallel.tp_size = tp_size;
    mo.parallel.tp_rank = tp_rank;
    mo.parallel.pp_size = pp_size;
    mo.parallel.pp_rank = pp_rank;
    mo.is_mla = o.shape.mla;
    mo.bootstrap_addr =
        o.bootstrap_via ? o.bootstrap_via(c->bootstrap_address()) : c->bootstrap_address();
    mo.start_bootstrap_server = false;
    if (o.tweak) o.tweak(mo);
    std::string name = std::string(RoleName(role));
    if (pp_size > 1) name += " pp" + std::to_string(pp_rank);
    name += " tp" + std::to_string(tp_rank);
    KVB_ASSIGN_OR_RETURN(std::unique_ptr<Transport> t, CreateLoopbackTransport(c->fabric_, name));
    if (o.wrap) t = o.wrap(std::move(t), role, index);
    CoreHooks hooks = o.hooks;
    if (o.tweak_hooks) o.tweak_hooks(hooks, role, index);
    KVB_ASSIGN_OR_RETURN(r.manager, CreateManager(mo, std::move(t), std::move(hooks)));
    out->push_back(std::move(r));
    return Status();
  };
  for (int i = 0; i < o.prefill_pp * o.prefill_tp; ++i)
    KVB_RETURN_IF_ERROR(make(Role::kPrefill, o.prefill_tp, o.prefill_pp, i, &c->prefill));
  for (int i = 0; i < o.decode_pp * o.decode_tp; ++i)
    KVB_RETURN_IF_ERROR(make(Role::kDecode, o.decode_tp, o.decode_pp, i, &c->decode));
  return c;
}

TestCluster::~TestCluster() {
  // Managers first (they talk to the server and each other), pools last.
  for (auto& r : decode) r.manager.reset();
  for (auto& r : prefill) r.manager.reset();
}

void TolerantLiveness(ManagerOptions& m) {
  m.heartbeat_interval = std::chrono::milliseconds(50);
  m.heartbeat_misses = 40;
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
