// KVManager::TakeChangedRooms: a room is listed once after its Poll()
// answer changed, until taken; rooms whose handle is gone are not listed;
// nothing is listed without a change; a manager that does not keep the list
// says so instead of answering with nothing.
#include <gtest/gtest.h>

#include <algorithm>

#include "connector/connector_test_util.h"

namespace kvbridge::internal {
namespace {

std::vector<uint64_t> Take(KVManager& m) {
  auto r = m.TakeChangedRooms();
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::vector<uint64_t>{};
}

using Rooms = std::vector<uint64_t>;

TEST(RoomChangesTest, EachChangedRoomIsListedOnceUntilTakenAndReleasedOnesNever) {
  ClusterOptions o;
  o.tweak = [](ManagerOptions& m) { m.list_room_changes = true; };
  auto made = TestCluster::Create(o);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  TestCluster& c = **made;
  KVManager& prefill = *c.prefill[0].manager;
  KVManager& decode = *c.decode[0].manager;
  EXPECT_EQ(Take(prefill), Rooms{});
  EXPECT_EQ(Take(decode), Rooms{});

  // Both sides reach WaitingForInput (decode before its metadata, prefill
  // once it came): each lists the room once.
  Request a{.room = 7, .src = {1, 2, 3}, .dst = {4, 5, 6}};
  ASSERT_NO_FATAL_FAILURE(Start(c, a, false));
  EXPECT_EQ(Take(decode), Rooms{7});
  EXPECT_EQ(Take(prefill), Rooms{7});
  // Nothing moves until the pages are sent: nothing is listed.
  EXPECT_EQ(Take(decode), Rooms{});
  EXPECT_EQ(Take(prefill), Rooms{});

  // Two chunks take each side through Transferring to Success: still once.
  ASSERT_NO_FATAL_FAILURE(SendChunks(a, {1, 2}));
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(c, a));
  EXPECT_EQ(Take(decode), Rooms{7});
  EXPECT_EQ(Take(prefill), Rooms{7});

  // A second request fails (decode aborts it). Prefill's sender is released
  // before its list is taken: a room whose handle is gone is not listed.
  Request b{.room = 8, .src = {7, 8}, .dst = {9, 10}};
  ASSERT_NO_FATAL_FAILURE(Start(c, b, false));
  EXPECT_EQ(Take(decode), Rooms{8});
  EXPECT_EQ(Take(prefill), Rooms{8});
  b.receivers[0]->Abort();
  ASSERT_TRUE(WaitFor([&] { return b.senders[0]->Poll() == KVPoll::kFailed; }));
  b.senders.clear();
  a.senders.clear();
  EXPECT_EQ(Take(prefill), Rooms{});
  EXPECT_EQ(Take(decode), Rooms{8});
  EXPECT_EQ(b.receivers[0]->Poll(), KVPoll::kFailed);
}

TEST(RoomChangesTest, AManagerThatKeepsNoListSaysSo) {
  auto made = TestCluster::Create(ClusterOptions{});
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  auto r = (*made)->decode[0].manager->TakeChangedRooms();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("list_room_changes"), std::string::npos)
      << r.status().ToString();
}

}  // namespace
}  // namespace kvbridge::internal
