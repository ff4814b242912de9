// A rank whose transport thread is stuck (a message handler that does not
// return) hears nothing, and its peers soon take it for silent. The rank
// itself must say so first, once, naming the step and how to see where it
// waits, and carry on when the step ends.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <memory>
#include <mutex>

#include "common/log_capture.h"
#include "connector/connector_test_util.h"
#include "transport/forwarding_transport.h"
#include "transport/test_util.h"
#include "transport/ucx/ucx_test_util.h"

namespace kvbridge::internal {
namespace {

// UCX over TCP whose message handler, once armed, blocks in the next
// message that arrives until released: the progress thread is in that
// handler all that time, as a handler stuck on a lock would hold it.
class StallingHandler final : public ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  // Released first: the progress thread must leave the handler before the
  // inner transport joins it.
  ~StallingHandler() override { Release(); }
  void SetMessageHandler(MessageHandler h) override {
    inner_->SetMessageHandler([s = state_, h = std::move(h)](std::string_view payload) {
      if (s->armed.exchange(false)) {
        s->entered.Open();
        s->released.wait();
      }
      h(payload);
    });
  }
  void Arm() { state_->armed = true; }
  void WaitEntered() { state_->entered.Wait(); }
  void Release() {
    std::call_once(state_->once, [&] { state_->release.set_value(); });
  }

 private:
  // Shared with the handler, which the inner transport may call until it is
  // destroyed.
  struct State {
    std::atomic<bool> armed{false};
    testing::Gate entered;
    std::once_flag once;
    std::promise<void> release;
    std::shared_future<void> released = release.get_future().share();
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

// A cluster whose decode rank's message handler can be stalled (UCX over
// TCP on both sides), beating every `interval` with a limit of ten.
struct StallCluster {
  std::unique_ptr<TestCluster> c;
  StallingHandler* decode_transport = nullptr;
};
StallCluster MakeStallCluster(std::chrono::milliseconds interval) {
  StallCluster s;
  ClusterOptions o;
  o.tweak = [interval](ManagerOptions& m) {
    m.heartbeat_interval = interval;
    m.heartbeat_misses = 10;
  };
  o.wrap = [&s](std::unique_ptr<Transport>, Role r, int) -> std::unique_ptr<Transport> {
    auto t = testing::MakeUcxForTest(
        testing::TcpTestOptions(r == Role::kPrefill ? "prefill" : "decode", false));
    if (!t || r == Role::kPrefill) return t;
    auto stalling = std::make_unique<StallingHandler>(std::move(t));
    s.decode_transport = stalling.get();
    return stalling;
  };
  auto c = TestCluster::Create(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (c.ok()) s.c = std::move(c).value();
  return s;
}

TEST(StuckDeliveryTest, ARankSaysOnceWhichStepItsTransportThreadIsStuckIn) {
  // Silence limit 0.5 s: said from 0.25 s on.
  StallCluster s = MakeStallCluster(std::chrono::milliseconds(50));
  ASSERT_TRUE(s.c);
  ASSERT_NE(s.decode_transport, nullptr);
  auto& c = s.c;
  StallingHandler* decode_transport = s.decode_transport;
  // Destroyed before the cluster: a failed assertion leaves no thread stuck.
  struct ReleaseOnExit {
    StallingHandler* t;
    ~ReleaseOnExit() { t->Release(); }
  } guard{decode_transport};
  Request first{.room = 1, .src = {1, 2}, .dst = {3, 4}};
  Start(*c, first, false);
  SendChunks(first, {2});
  ExpectDelivered(*c, first);

  testing::LogCapture log;
  KVManager& decode = *c->decode[0].manager;
  ManagerImpl& decode_core = ManagerAccess::Of(decode);
  // Judged as between hosts: /proc would otherwise vouch for prefill.
  decode_core.JudgeLivenessAsRemoteForTest();
  decode_transport->Arm();
  decode_transport->WaitEntered();  // the next heartbeat from prefill
  const char* kWarn = "this rank's transport thread has been in the handler of an arriving message";
  ASSERT_TRUE(WaitFor([&] { return !log.Matching(kWarn).empty(); }, std::chrono::seconds(10)))
      << "no warning while the handler is stuck";
  // Ten more rounds on the same stuck step: still said once.
  const uint64_t rounds = decode.Stats().heartbeat_rounds;
  ASSERT_TRUE(WaitFor([&] { return decode.Stats().heartbeat_rounds >= rounds + 10; }));
  auto busy = decode_transport->DeliveryBusy();
  ASSERT_TRUE(busy.has_value());
  EXPECT_STREQ(busy->what, "the handler of an arriving message");
  decode_transport->Release();
  const std::vector<std::string> said = log.Matching(kWarn);
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find(fmt::format("gdb -p {}", getpid())), std::string::npos) << said[0];

  // Prefill's beats waited behind decode's stuck step for longer than the
  // silence limit: that silence was decode's, and decode blamed nobody.
  const RankId prefill = ManagerAccess::Of(*c->prefill[0].manager).self();
  ASSERT_TRUE(PeerAt(decode_core, prefill).has_value());
  EXPECT_FALSE(PeerAt(decode_core, prefill)->failed) << "decode blamed prefill for its own stall";
  // Once the step ends the rank carries on: nobody was blamed for it.
  Request next{.room = 2, .src = {5, 6}, .dst = {7, 8}};
  Start(*c, next, false);
  SendChunks(next, {2});
  ExpectDelivered(*c, next);
  EXPECT_EQ(decode.Stats().rooms_failed, 0u);
  EXPECT_EQ(c->prefill[0].manager->Stats().rooms_failed, 0u);
}

// A step stuck past a handshake budget (ten limits) is a deadlock, not a
// pause: the rank stops excusing its peers' silence then and names them,
// so that its requests do not hang on its own stuck thread. Not before.
TEST(StuckDeliveryTest, ARankStuckPastAHandshakeBudgetBlamesItsPeersAgain) {
  constexpr std::chrono::milliseconds kInterval{20};  // limit 0.2 s, budget 2 s
  StallCluster s = MakeStallCluster(kInterval);
  ASSERT_TRUE(s.c);
  ASSERT_NE(s.decode_transport, nullptr);
  struct ReleaseOnExit {
    StallingHandler* t;
    ~ReleaseOnExit() { t->Release(); }
  } guard{s.decode_transport};
  Request first{.room = 1, .src = {1, 2}, .dst = {3, 4}};
  Start(*s.c, first, false);
  SendChunks(first, {2});
  ExpectDelivered(*s.c, first);
  ManagerImpl& decode = ManagerAccess::Of(*s.c->decode[0].manager);
  decode.JudgeLivenessAsRemoteForTest();
  const RankId prefill = ManagerAccess::Of(*s.c->prefill[0].manager).self();
  s.decode_transport->Arm();
  s.decode_transport->WaitEntered();  // the next heartbeat from prefill
  const auto entered = std::chrono::steady_clock::now();
  ASSERT_TRUE(WaitFor([&] { return PeerAt(decode, prefill)->failed; }, std::chrono::seconds(20)))
      << "a rank stuck for good never named its silent peer";
  // The step began before `entered`: blamed no sooner than the budget after.
  const auto stuck_for = std::chrono::steady_clock::now() - entered;
  EXPECT_GE(stuck_for, 10 * 10 * kInterval - kInterval) << "blamed while the stall was excused";
}

}  // namespace
}  // namespace kvbridge::internal
