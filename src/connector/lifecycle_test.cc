// Manager metrics and a restarted rank, over the loopback transport.
#include <gtest/gtest.h>
#include <httplib.h>

#include <sstream>

#include "connector/test_cluster.h"

namespace kvbridge::internal {
namespace {

// Runs one request of `pages` pages from prefill[p] to decode[d] (1 -> 1).
void Transfer(TestCluster& c, uint64_t room, KVPoll expect = KVPoll::kSuccess) {
  std::vector<int32_t> src{1, 2, 3}, dst{7, 8, 9};
  auto rx = std::move(KVReceiver::Create(*c.decode[0].manager, room)).value();
  auto tx = std::move(KVSender::Create(*c.prefill[0].manager, room)).value();
  c.prefill[0].pool->Fill(room, src, 0, {});
  ASSERT_TRUE(rx->Init(0).ok());
  ASSERT_TRUE(rx->SendMetadata(dst, 0, {}).ok());
  ASSERT_TRUE(WaitFor([&] { return tx->Poll() == KVPoll::kWaitingForInput; }))
      << KVPollName(tx->Poll());
  ASSERT_TRUE(tx->Init(3, 0).ok());
  ASSERT_TRUE(tx->Send(src).ok());
  ASSERT_TRUE(WaitFor([&] { return rx->Poll() == expect; }));
  EXPECT_EQ(c.decode[0].pool->CountCorruptPages(room, dst), 0u);
}

double Scrape(int port, const std::string& name, const std::string& labels_have) {
  httplib::Client cli("127.0.0.1", port);
  auto res = cli.Get("/metrics");
  EXPECT_TRUE(res && res->status == 200);
  if (!res) return -1;
  std::istringstream in(res->body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + "{", 0) != 0 && line.rfind(name + " ", 0) != 0) continue;
    if (line.find(labels_have) == std::string::npos) continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  ADD_FAILURE() << name << " with " << labels_have << " not in:\n" << res->body;
  return -1;
}

TEST(ManagerMetricsTest, ScrapedCountersFollowTransfers) {
  ClusterOptions o;
  o.tweak = [](ManagerOptions& m) { m.metrics_port = -1; };
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const int port = (*c)->prefill[0].manager->metrics_port();
  ASSERT_GT(port, 0);
  EXPECT_EQ(Scrape(port, "kvbridge_transfers_total", "result=\"success\""), 0);
  Transfer(**c, 1);
  Transfer(**c, 2);
  ASSERT_TRUE(WaitFor([&] { return (*c)->prefill[0].manager->Stats().rooms_succeeded == 2; }));
  EXPECT_EQ(Scrape(port, "kvbridge_transfers_total", "result=\"success\""), 2);
  EXPECT_GT(Scrape(port, "kvbridge_transfer_bytes_total", "role=\"prefill\""), 0);
  EXPECT_EQ(Scrape(port, "kvbridge_request_latency_seconds_count", "role=\"prefill\""), 2);
  EXPECT_EQ(Scrape(port, "kvbridge_peers", "state=\"connected\""), 1);
  // A failure shows up by cause.
  auto tx = std::move(KVSender::Create(*(*c)->prefill[0].manager, 3)).value();
  tx->Abort();
  EXPECT_EQ(Scrape(port, "kvbridge_failures_total", "cause=\"aborted\""), 1);
}

TEST(RestartTest, RestartedPrefillRankServesNewRequestsThroughANewEndpoint) {
  ClusterOptions o;
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Transfer(**c, 1);
  const uint64_t old_incarnation = (*c)->prefill[0].manager->self().incarnation;
  // The prefill rank goes away (its transport with it) and comes back at
  // the same position as a new incarnation.
  ManagerOptions mo = (*c)->prefill[0].manager->options();
  (*c)->prefill[0].manager.reset();
  ASSERT_TRUE(WaitFor([&] { return (*c)->decode[0].manager->Stats().peers_connected == 0; }));
  auto restarted = CreateManager(
      mo, std::move(CreateLoopbackTransport((*c)->fabric(), "prefill tp0 (restarted)")).value());
  ASSERT_TRUE(restarted.ok()) << restarted.status().ToString();
  (*c)->prefill[0].manager = std::move(restarted).value();
  EXPECT_NE((*c)->prefill[0].manager->self().incarnation, old_incarnation);
  Transfer(**c, 2);  // the stale endpoint is not reused: this would hang
  EXPECT_EQ((*c)->decode[0].manager->Stats().peers_connected, 1u);
}

}  // namespace
}  // namespace kvbridge::internal
