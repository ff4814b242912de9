// The ticker does no network waits (issue 10, defect 2): a registry that
// accepts connections and never answers holds up bootstrap lookups, never
// the heartbeat rounds that keep peers from blaming this rank.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

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

// A decode manager whose registry is `registry` (a black hole): every
// lookup of a prefill rank waits for the client's timeout.
Result<std::unique_ptr<KVManager>> DecodeBehind(const BlackHole& registry,
                                                std::unique_ptr<KvPool>* pool) {
  PoolOptions po;
  po.num_pages = 16;
  KVB_ASSIGN_OR_RETURN(*pool, KvPool::Create(po));
  ManagerOptions mo;
  mo.role = Role::kDecode;
  mo.args = (*pool)->Args();
  mo.bootstrap_addr = registry.address();
  mo.start_bootstrap_server = false;
  mo.heartbeat_interval = std::chrono::milliseconds(50);
  // The registry counts as lost only after 20 s: requests keep retrying
  // their lookups for the whole test.
  mo.heartbeat_misses = 400;
  auto fabric = std::make_shared<LoopbackFabric>();
  KVB_ASSIGN_OR_RETURN(auto transport, CreateLoopbackTransport(fabric, "decode tp0"));
  // Registration times out (a decode rank goes on without it).
  return CreateManager(mo, std::move(transport));
}

TEST(TickerTest, RegistryThatNeverAnswersDelaysNoHeartbeatRound) {
  BlackHole registry;
  ASSERT_TRUE(registry.ok());
  std::unique_ptr<KvPool> pool;
  auto m = DecodeBehind(registry, &pool);
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

// KVReceiver::Init is called on the scheduler's thread (sglang's decode
// loop): it finds the request's prefill ranks without waiting on the
// network. Against a registry that never answers, each lookup waits 2 s
// for the client's timeout: ten Inits take 20 s or more when Init waits
// for its lookup (and for the resolver's, which holds the same lock), and
// return at once when the resolver thread does the lookups.
TEST(TickerTest, InitWaitsForNoLookupOfARegistryThatNeverAnswers) {
  BlackHole registry;
  ASSERT_TRUE(registry.ok());
  std::unique_ptr<KvPool> pool;
  auto m = DecodeBehind(registry, &pool);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  std::vector<std::unique_ptr<KVReceiver>> rooms;
  std::atomic<bool> returned{false};
  std::thread caller([&] {
    for (uint64_t room = 1; room <= 10; ++room) {
      rooms.push_back(std::move(KVReceiver::Create(**m, room)).value());
      EXPECT_TRUE(rooms.back()->Init(0).ok());
    }
    returned = true;
  });
  const bool fast = WaitFor([&] { return returned.load(); }, std::chrono::seconds(5));
  caller.join();
  EXPECT_TRUE(fast) << "ten Inits waited on the registry";
  // The lookups still wait, on the resolver: every request bootstraps.
  for (const auto& rx : rooms) EXPECT_EQ(rx->Poll(), KVPoll::kBootstrapping);
}

}  // namespace
}  // namespace kvbridge::internal
