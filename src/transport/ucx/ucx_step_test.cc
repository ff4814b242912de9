// The progress thread names the step it is stuck in (Transport::DeliveryBusy):
// a rank whose handler of an arriving message never returns hears nothing
// more, and its manager must be able to say where it waits.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>

#include "transport/test_util.h"
#include "transport/ucx/ucx_test_util.h"
#include "transport/ucx/ucx_transport_impl.h"

namespace kvbridge::internal::ucx {
namespace {

using namespace std::chrono_literals;

TEST(UcxStepTest, AHandlerThatDoesNotReturnIsNamedWithHowLongItHasRun) {
  auto target = testing::MakeUcxForTest(testing::TcpTestOptions("target", false));
  auto sender = testing::MakeUcxForTest(testing::TcpTestOptions("sender", false));
  ASSERT_TRUE(target && sender);
  testing::Gate entered;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  target->SetMessageHandler([&, released](std::string_view) {
    entered.Open();
    released.wait();
  });
  auto peer = sender->Connect(target->Address());
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  ASSERT_TRUE(sender->SendMessage(*peer, "hello").ok());
  entered.Wait();
  // Held in the handler (the gate above is the barrier): the step is named,
  // and its duration grows while it lasts.
  auto first = target->DeliveryBusy();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(std::string(first->what), "the handler of an arriving message");
  const auto until = std::chrono::steady_clock::now() + 10s;
  std::optional<StepWatch::Busy> later;
  do {
    later = target->DeliveryBusy();
    ASSERT_TRUE(later.has_value());
  } while (later->for_us < 50ms && std::chrono::steady_clock::now() < until);
  EXPECT_GE(later->for_us, 50ms);
  EXPECT_EQ(later->step, first->step) << "one step, read twice";
  release.set_value();
  // Stats runs on the progress thread: once it answers, the handler is done
  // and the thread is between steps or in a later one.
  static_cast<UcxTransport&>(*target).Stats();
  auto after = target->DeliveryBusy();
  EXPECT_TRUE(!after.has_value() || after->step != first->step);
}

}  // namespace
}  // namespace kvbridge::internal::ucx
