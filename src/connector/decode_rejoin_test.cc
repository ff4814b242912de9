// A decode rank that the others declared failed and that rejoined: what it
// keeps of its old incarnation's peers must not fail its new requests, and
// what it declared failed in the registry must still fail them.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <vector>

#include "common/log.h"
#include "common/log_capture.h"
#include "connector/connector_test_util.h"
#include "connector/registry_test_util.h"
#include "connector/stall_proxy.h"
#include "transport/fault/fault_transport.h"

namespace kvbridge::internal {
namespace {

// Loopback ranks in faults (prefill's first); decode reaches the registry
// through `*proxy` (made here). Prefill declares a silent decode rank
// failed after 8 x 50 ms; decode's own limit is high (20 s), so it blames
// no one while its registry does not answer.
ClusterOptions DecodeRejoinCluster(std::vector<FaultTransport*>* faults,
                                   std::unique_ptr<StallProxy>* proxy) {
  ClusterOptions o;
  o.wrap = WrapInFaults(faults);
  o.tweak = [proxy](ManagerOptions& m) {
    m.heartbeat_interval = std::chrono::milliseconds(50);
    m.heartbeat_misses = m.role == Role::kDecode ? 400 : 8;
    if (m.role != Role::kDecode) return;
    *proxy = std::make_unique<StallProxy>(m.bootstrap_addr);
    m.bootstrap_addr = (*proxy)->address();
  };
  return o;
}

// Review finding (session 35): a rejoin retires the old incarnation's peers
// with this rank's own failure record. A lookup of a prefill rank that then
// fails for a moment (the registry does not answer) took a retired peer's
// record for that prefill rank's death and failed the new request with it:
// decode named itself as the origin. The lookup must be retried instead,
// and the request succeed once the registry answers.
TEST(DecodeRejoinTest, ALookupThatFailsAfterARejoinIsRetriedNotBlamedOnTheOldIncarnation) {
  std::vector<FaultTransport*> faults;  // prefill, decode
  std::unique_ptr<StallProxy> proxy;
  auto c = TestCluster::Create(DecodeRejoinCluster(&faults, &proxy));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(faults.size(), 2u);
  ASSERT_TRUE(proxy && proxy->ok());
  KVManager& decode = *(*c)->decode[0].manager;
  const RankId before = ManagerAccess::Of(decode).self();
  Request old{.room = 31, .src = {1, 2, 3, 4}, .dst = {30, 31, 32, 33}};
  ASSERT_NO_FATAL_FAILURE(Start(**c, old, /*senders_first=*/false));
  // Decode goes silent: prefill declares it failed, and decode rejoins
  // once it reads the record naming it.
  faults[1]->DropUrgentMessages(true);
  faults[1]->DropMessages(true);
  ASSERT_TRUE(WaitFor([&] { return old.senders[0]->Poll() == KVPoll::kFailed; }));
  ASSERT_TRUE(WaitFor([&] { return decode.Stats().rejoins == 1; }));
  EXPECT_NE(ManagerAccess::Of(decode).self().incarnation, before.incarnation);
  faults[1]->DropUrgentMessages(false);
  faults[1]->DropMessages(false);
  old.senders.clear();
  old.receivers.clear();

  // The registry stops answering as the next request looks prefill up.
  ASSERT_TRUE(SetLogLevel("debug"));
  testing::LogCapture log;
  proxy->Stall();
  Request next{.room = 32, .src = {5, 6, 7, 8}, .dst = {40, 41, 42, 43}};
  next.receivers.push_back(std::move(KVReceiver::Create(decode, next.room)).value());
  ASSERT_TRUE(next.receivers[0]->Init(0).ok());
  // The barrier: the lookup of prefill's rank failed while stalled (2 s).
  const bool looked_up = WaitFor([&] {
    for (const std::string& line : log.Matching("GET /route?prefill_dp_rank=0"))
      if (line.find("unreachable") != std::string::npos) return true;
    return false;
  });
  SetLogLevel("warn");
  ASSERT_TRUE(looked_up) << "no lookup failed while the registry did not answer";
  EXPECT_NE(next.receivers[0]->Poll(), KVPoll::kFailed) << next.receivers[0]->Failure()->Message();
  proxy->ResumeDroppingHeld();
  next.senders.push_back(std::move(KVSender::Create(*(*c)->prefill[0].manager, next.room)).value());
  ASSERT_TRUE(WaitFor([&] { return next.receivers[0]->Poll() == KVPoll::kWaitingForInput; }))
      << KVPollName(next.receivers[0]->Poll())
      << (next.receivers[0]->Failure() ? ": " + next.receivers[0]->Failure()->Message() : "");
  ASSERT_TRUE(next.receivers[0]->SendMetadata(next.dst, next.dst_aux, next.dst_state).ok());
  (*c)->prefill[0].pool->Fill(next.room, next.src, next.src_aux, next.src_state);
  ASSERT_TRUE(WaitFor([&] { return next.senders[0]->Poll() == KVPoll::kWaitingForInput; }))
      << KVPollName(next.senders[0]->Poll());
  ASSERT_TRUE(next.senders[0]->Init(next.src.size(), next.src_aux).ok());
  ASSERT_NO_FATAL_FAILURE(SendChunks(next, {4}));
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(**c, next));
}

// Waits until the registry at `server` holds a rank failure naming `origin`'s
// process (its position and incarnation).
void AwaitRankRecord(const std::string& server, const RankId& origin) {
  auto client =
      BootstrapClient::Create(server, std::chrono::milliseconds(2000), AuthTokenFromEnvironment());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto held = [&] {
    Result<FailureBatch> b = (*client)->FailuresSince(0);
    if (!b.ok()) return false;
    for (const auto& j : b->records) {
      Result<FailureRecord> r = FailureRecordFromJson(j);
      if (r.ok() && IsRankFailure(r->cause) && r->origin.SameRank(origin) &&
          r->origin.incarnation == origin.incarnation)
        return true;
    }
    return false;
  };
  ASSERT_TRUE(WaitFor(held)) << "the registry never held a record of " << origin.ToString();
}

// A decode rank that declared a prefill process failed, and got that into
// the registry, is then itself declared failed and rejoins. The prefill
// process lives on at the same incarnation (it is cut off from the
// registry, so nothing has fenced it yet): every rank holds it failed, and
// so must the rejoined decode rank. Before, the rejoin forgot every record
// this rank had detected, published ones too: its next request looked the
// prefill rank up, met the declared-failed process again as a healthy peer
// and went on with it.
TEST(DecodeRejoinTest, AProcessThisRankDeclaredFailedInTheRegistryStaysFailedAfterItsRejoin) {
  std::unique_ptr<StallProxy> proxy;  // prefill's way to the registry
  ClusterOptions o;
  o.decode_tp = 2;
  o.tweak = [&proxy](ManagerOptions& m) {
    TolerantLiveness(m);
    if (m.role != Role::kPrefill) return;
    m.heartbeat_misses = 400;  // it counts the registry lost only after 20 s
    proxy = std::make_unique<StallProxy>(m.bootstrap_addr);
    m.bootstrap_addr = proxy->address();
  };
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(proxy && proxy->ok());
  Request first{.room = 41, .src = {1, 2, 3, 4}, .dst = {30, 31, 32, 33}};
  ASSERT_NO_FATAL_FAILURE(Start(**c, first, /*senders_first=*/false));
  ASSERT_NO_FATAL_FAILURE(SendChunks(first, {4}));
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(**c, first));
  ManagerImpl& prefill = ManagerAccess::Of(*(*c)->prefill[0].manager);
  ManagerImpl& decode = ManagerAccess::Of(*(*c)->decode[0].manager);
  ManagerImpl& sibling = ManagerAccess::Of(*(*c)->decode[1].manager);
  const RankId cut_off = prefill.self();
  const RankId before = decode.self();
  const std::string server = (*c)->bootstrap_address();

  // Prefill no longer reaches the registry. Decode tp0 declares it failed,
  // as its own finding, and publishes that.
  proxy->Stall();
  FailureRecord blame = DeathOf(cut_off);
  blame.cause = FailureCause::kPeerUnresponsive;
  blame.detail = "no heartbeat for 2.00 s";
  blame.mechanism = "peer heartbeat";
  blame.detected_by = before;
  decode.ApplyRecordForTest(blame, /*publish=*/true);
  ASSERT_NO_FATAL_FAILURE(AwaitRankRecord(server, cut_off));

  // Then its sibling declares decode tp0 failed: it reads that, and rejoins.
  FailureRecord death = DeathOf(before);
  death.cause = FailureCause::kPeerUnresponsive;
  death.detected_by = sibling.self();
  sibling.ApplyRecordForTest(death, /*publish=*/true);
  ASSERT_TRUE(WaitFor([&] { return decode.Stats().rejoins == 1; })) << "decode never rejoined";
  ASSERT_NE(decode.self().incarnation, before.incarnation);

  // Its next request reads from the prefill rank it declared failed, still
  // at that incarnation: it fails with that record instead of meeting it.
  auto rx = std::move(KVReceiver::Create(*(*c)->decode[0].manager, 42)).value();
  ASSERT_TRUE(rx->Init(0).ok());
  ASSERT_TRUE(WaitFor([&] {
    const KVPoll p = rx->Poll();
    return p == KVPoll::kFailed || p == KVPoll::kWaitingForInput;
  })) << KVPollName(rx->Poll());
  ASSERT_EQ(rx->Poll(), KVPoll::kFailed) << "the declared-failed prefill process was met again";
  const FailureRecord why = *rx->Failure();
  EXPECT_TRUE(why.origin.SameRank(cut_off)) << why.Message();
  EXPECT_EQ(why.origin.incarnation, cut_off.incarnation) << why.Message();
  EXPECT_EQ(why.detail, blame.detail) << why.Message();
  proxy->ResumeDroppingHeld();  // the managers deregister through it
}

}  // namespace
}  // namespace kvbridge::internal
