// A connect to a host that drops SYNs (partitioned, or a lost SYN on a lossy
// link) must not stall the UCX transport: Connect returns at once and the
// messages to every other peer keep moving. UCX 1.13's default TCP connect
// is blocking and ran inside Connect on the progress thread: 135 s with
// SYNs dropped, during which no peer's message moved
// (src/transport/ucx/ucx_transport.cc, UCX_TCP_CONN_NB).
//
// The test re-runs itself under `unshare --net`: three UCX transports over
// TCP on the loopback of a network namespace of its own, with an nftables
// rule there that drops every SYN once the first connection is up.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/netns/hosts_util.h"
#include "transport/ucx/ucx_test_util.h"

namespace kvbridge::tools {
namespace {

using internal::PeerId;
using internal::Transport;
using internal::UcxTransportOptions;
using namespace std::chrono_literals;

constexpr const char* kChildEnv = "KVB_CONNECT_TEST_IN_NETNS";
constexpr const char* kTestName = "UcxConnectTest.AHostThatDropsSynsStallsNoOtherPeer";

// Messages one transport received, waited for with a deadline.
class Inbox {
 public:
  void Push(std::string_view m) {
    std::lock_guard<std::mutex> lock(mu_);
    got_.emplace_back(m);
    cv_.notify_all();
  }
  bool WaitFor(const std::string& m, std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, limit, [&] {
      for (const auto& g : got_)
        if (g == m) return true;
      return false;
    });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> got_;
};

std::unique_ptr<Transport> Make(const char* name) {
  UcxTransportOptions o = internal::testing::TcpTestOptions(name, /*same_host=*/false);
  o.shm_error_handling = false;
  return internal::testing::MakeUcxForTest(o);
}

// The part that runs inside the namespace.
void RunInNamespace() {
  ASSERT_EQ(std::system("ip link set lo up"), 0);
  auto sender = Make("sender");
  auto healthy = Make("healthy");
  auto cut_off = Make("cut off");
  ASSERT_TRUE(sender && healthy && cut_off);
  Inbox inbox;
  healthy->SetMessageHandler([&](std::string_view m) { inbox.Push(m); });
  sender->SetPeerFailureHandler([](PeerId, const Status&) {});
  auto to_healthy = sender->Connect(healthy->Address());
  ASSERT_TRUE(to_healthy.ok()) << to_healthy.status().ToString();
  ASSERT_TRUE(sender->SendMessage(*to_healthy, "before").ok());
  ASSERT_TRUE(inbox.WaitFor("before", 10s)) << "no message over a working link";

  // From here no new TCP connection in this namespace completes.
  ASSERT_EQ(std::system("nft add table inet kvb && nft add chain inet kvb in '{ type filter "
                        "hook input priority 0; }' && nft add rule inet kvb in tcp flags syn drop"),
            0);
  auto connecting =
      std::async(std::launch::async, [&] { return sender->Connect(cut_off->Address()); });
  // Limits far above a working run's milliseconds, far below the 1 s a
  // single SYN retransmission costs a blocking connect (135 s in all).
  const bool returned = connecting.wait_for(900ms) == std::future_status::ready;
  EXPECT_TRUE(returned) << "Connect to a host that drops SYNs blocked";
  if (returned) {
    EXPECT_TRUE(connecting.get().ok()) << "a pending connect is not a failure yet";
  }
  // Sent after the connect began: a connect that holds the progress thread
  // holds this message too.
  ASSERT_TRUE(sender->SendMessage(*to_healthy, "after").ok());
  EXPECT_TRUE(inbox.WaitFor("after", 900ms))
      << "a message to a healthy peer waited behind a connect to a host that drops SYNs";
  // Exit without tearing down (nor waiting for a blocked Connect): closing
  // an endpoint whose connect never completes is UCX's business, and the
  // namespace goes with this process.
  std::fflush(nullptr);
  std::_Exit(::testing::Test::HasFailure() ? 1 : 0);
}

TEST(UcxConnectTest, AHostThatDropsSynsStallsNoOtherPeer) {
  if (std::getenv(kChildEnv) != nullptr) {
    RunInNamespace();
    return;
  }
  KVB_SKIP_WITHOUT_HOSTS();
  setenv(kChildEnv, "1", 1);
  const std::string cmd = std::string("unshare --net /proc/") + std::to_string(getpid()) +
                          "/exe --gtest_filter=" + kTestName + " 2>&1";
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  char buf[4096];
  while (fgets(buf, sizeof(buf), f) != nullptr) out += buf;
  const int rc = pclose(f);
  unsetenv(kChildEnv);
  EXPECT_EQ(rc, 0) << "the run in its own network namespace failed:\n" << out;
}

}  // namespace
}  // namespace kvbridge::tools
