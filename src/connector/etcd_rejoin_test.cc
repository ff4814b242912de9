// Issue 13: a rank fenced by etcd's lease alone rejoins. In-process managers
// over the loopback transport with an etcd registry (one member started
// here; skipped when /usr/bin/etcd is missing).
#include <gtest/gtest.h>

#include "connector/connector_test_util.h"
#include "control/auth.h"
#include "control/etcd_gateway.h"
#include "tools/etcd_cluster.h"

namespace kvbridge::internal {
namespace {

using nlohmann::json;

// etcd's picture of the deployment, as a watcher outside the ranks.
std::unique_ptr<EtcdGateway> Gateway(const tools::EtcdCluster& etcd) {
  EtcdGatewayOptions go;
  go.endpoints = ParseEtcdEndpoints(etcd.Endpoints()).value();
  return std::move(EtcdGateway::Create(go)).value();
}

// The rank stayed connected to its peers, but etcd got none of its
// keep-alives for the record lease's TTL (here: the lease revoked, as etcd
// does when it expires), so every rank counts that incarnation dead and no
// failure record names it. The rank must not run on as a process etcd has
// no record of: it fails its rooms, rejoins as a new incarnation, and serves
// the next request. Before, its heartbeat was refused every round and
// nothing else happened: decode could no longer find prefill rank 0.
TEST(EtcdRejoinTest, ARankWhoseRecordLeaseExpiredRejoinsAsANewIncarnation) {
  if (!tools::EtcdCluster::Available()) GTEST_SKIP() << "/usr/bin/etcd missing (etcd-server)";
  EnsureAuthTokenInEnvironment();
  auto etcd = tools::EtcdCluster::Start({});
  ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
  const std::string url = (*etcd)->Url("lease-rejoin");
  ClusterOptions o;
  o.tweak = [&](ManagerOptions& m) {
    TolerantLiveness(m);  // the peers never blame each other here
    m.registry = url;
  };
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  KVManager& prefill = *(*c)->prefill[0].manager;
  Request first{.room = 1, .src = {1, 2, 3}, .dst = {7, 8, 9}};
  ASSERT_NO_FATAL_FAILURE(Start(**c, first, /*senders_first=*/false));
  ASSERT_NO_FATAL_FAILURE(SendChunks(first, {3}));
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(**c, first));
  first.senders.clear();
  first.receivers.clear();
  // A request under way when etcd drops the rank.
  Request held{.room = 2, .src = {4, 5}, .dst = {10, 11}};
  ASSERT_NO_FATAL_FAILURE(Start(**c, held, /*senders_first=*/false));

  const RankId before = prefill.self();
  auto gw = Gateway(**etcd);
  EtcdKv kv;
  bool found = false;
  ASSERT_TRUE(gw->Get("/kvbridge/lease-rejoin/ranks/prefill/dp0/cp0/tp0/pp0", &kv, &found).ok());
  ASSERT_TRUE(found);
  ASSERT_NE(kv.lease, 0);
  ASSERT_TRUE(gw->LeaseRevoke(kv.lease).ok());

  ASSERT_TRUE(WaitFor([&] { return prefill.Stats().rejoins == 1; }, std::chrono::seconds(20)))
      << "the rank etcd counts dead did not rejoin";
  const RankId after = prefill.self();
  EXPECT_TRUE(after.SameRank(before));
  EXPECT_NE(after.incarnation, before.incarnation);
  // Its request under way failed, naming the old incarnation and why.
  ASSERT_TRUE(WaitFor([&] { return held.senders[0]->Poll() == KVPoll::kFailed; }));
  ASSERT_TRUE(held.senders[0]->Failure().has_value());
  const FailureRecord why = *held.senders[0]->Failure();
  EXPECT_EQ(why.origin.incarnation, before.incarnation) << why.Message();
  EXPECT_NE(why.detail.find("the registry counts this incarnation dead"), std::string::npos)
      << why.Message();
  held.senders.clear();
  held.receivers.clear();
  // The new incarnation serves the next request.
  Request next{.room = 3, .src = {6, 7, 8, 9}, .dst = {12, 13, 14, 15}};
  ASSERT_NO_FATAL_FAILURE(Start(**c, next, /*senders_first=*/false));
  ASSERT_NO_FATAL_FAILURE(SendChunks(next, {2, 2}));
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(**c, next));
  // Once: the refusal of the old incarnation does not fence the new one.
  EXPECT_EQ(prefill.Stats().rejoins, 1u);
  EXPECT_EQ(prefill.self().incarnation, after.incarnation);
}

}  // namespace
}  // namespace kvbridge::internal
