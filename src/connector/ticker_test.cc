// The ticker does no network waits (issue 10, defect 2): a registry that
// accepts connections and never answers holds up bootstrap lookups, never
// the heartbeat rounds that keep peers from blaming this rank.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "connector/test_cluster.h"

namespace kvbridge::internal {
namespace {

// A TCP listener on loopback whose connections the kernel accepts and no
// one ever reads or answers.
class BlackHole {
 public:
  BlackHole() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 || listen(fd_, 128) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      return;
    port_ = ntohs(a.sin_port);
  }
  ~BlackHole() {
    if (fd_ >= 0) close(fd_);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  bool ok() const { return port_ != 0; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST(TickerTest, RegistryThatNeverAnswersDelaysNoHeartbeatRound) {
  BlackHole registry;
  ASSERT_TRUE(registry.ok());
  PoolOptions po;
  po.num_pages = 16;
  auto pool = KvPool::Create(po);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  ManagerOptions mo;
  mo.role = Role::kDecode;
  mo.args = (*pool)->Args();
  mo.bootstrap_addr = registry.address();
  mo.start_bootstrap_server = false;
  mo.heartbeat_interval = std::chrono::milliseconds(50);
  // The registry counts as lost only after 20 s: the request keeps retrying
  // its lookup for the whole test.
  mo.heartbeat_misses = 400;
  auto fabric = std::make_shared<LoopbackFabric>();
  auto transport = CreateLoopbackTransport(fabric, "decode tp0");
  ASSERT_TRUE(transport.ok());
  // Registration times out (a decode rank goes on without it).
  auto m = CreateManager(mo, std::move(transport).value());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  KVManager& manager = **m;
  // A request whose prefill instance cannot be looked up: every retry of
  // the lookup waits on the silent registry.
  auto rx = std::move(KVReceiver::Create(manager, 1)).value();
  ASSERT_TRUE(rx->Init(0).ok());
  ASSERT_EQ(rx->Poll(), KVPoll::kBootstrapping);
  // Each lookup waits 2 s for its answer; 20 rounds of 50 ms take 1 s when
  // the ticker never waits with it, and 40 s when it does.
  const uint64_t before = manager.Stats().heartbeat_rounds;
  EXPECT_TRUE(WaitFor([&] { return manager.Stats().heartbeat_rounds >= before + 20; },
                      std::chrono::seconds(10)))
      << "heartbeat rounds: " << manager.Stats().heartbeat_rounds - before << " in 10 s";
  EXPECT_EQ(rx->Poll(), KVPoll::kBootstrapping);
}

}  // namespace
}  // namespace kvbridge::internal
