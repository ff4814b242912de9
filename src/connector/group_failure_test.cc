// Reasons travel (issue 10, defect 4): a request that fails on one rank for
// a reason of its own (an abort, bad input) fails on every rank of both
// groups that holds it, with the same record, and a rank whose own room did
// not fail can still say why its group failed.
#include <gtest/gtest.h>

#include "common/log_capture.h"
#include "connector/connector_test_util.h"
#include "connector/registry_test_util.h"
#include "connector/stall_proxy.h"
#include "control/auth.h"
#include "control/bootstrap_client.h"
#include "control/record_json.h"
#include "transport/fault/fault_transport.h"

namespace kvbridge::internal {
namespace {

ClusterOptions TwoByTwo(std::vector<FaultTransport*>* faults = nullptr) {
  ClusterOptions o;
  o.prefill_tp = 2;
  o.decode_tp = 2;
  o.tweak = TolerantLiveness;
  if (faults != nullptr) o.wrap = WrapInFaults(faults);
  return o;
}

void ExpectSameRecord(const FailureRecord& got, const FailureRecord& want) {
  EXPECT_TRUE(got.origin.SameRank(want.origin)) << got.Message();
  EXPECT_EQ(got.origin.pid, want.origin.pid) << got.Message();
  EXPECT_EQ(got.cause, want.cause) << got.Message();
  EXPECT_EQ(got.detail, want.detail) << got.Message();
  EXPECT_TRUE(got.detected_by.SameRank(want.detected_by)) << got.Message();
  EXPECT_TRUE(got.is_from_another_rank) << got.Message();
}

// Waits until the registry holds a room record for `room` (the barrier for
// checks that need it published).
void AwaitRoomRecord(TestCluster& c, uint64_t room) {
  auto client = BootstrapClient::Create(c.server->address(), std::chrono::milliseconds(2000),
                                        AuthTokenFromEnvironment());
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE(WaitFor([&] {
    Result<FailureBatch> b = (*client)->FailuresSince(0);
    if (!b.ok()) return false;
    for (const auto& j : b->records)
      if (j.value("room", uint64_t{0}) == room) return true;
    return false;
  }));
}

// Decode reaches the registry through `*proxy` (made here), which a test
// stalls; the heartbeat limit is high, so no rank counts the registry lost
// meanwhile.
ClusterOptions DecodeBehindAStallProxy(std::unique_ptr<StallProxy>* proxy,
                                       std::chrono::milliseconds waiting_timeout) {
  ClusterOptions o;
  o.tweak = [proxy, waiting_timeout](ManagerOptions& m) {
    TolerantLiveness(m);
    m.heartbeat_misses = 400;  // 20 s
    m.waiting_timeout = waiting_timeout;
    if (m.role != Role::kDecode) return;
    *proxy = std::make_unique<StallProxy>(m.bootstrap_addr);
    m.bootstrap_addr = (*proxy)->address();
  };
  return o;
}

TEST(GroupFailureTest, AnAbortOnOneDecodeRankFailsEveryRankOfBothGroupsWithItsRecord) {
  auto c = TestCluster::Create(TwoByTwo());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  TestCluster& cluster = **c;
  Request r{.room = 41, .src = Scattered(8, 64, 5), .dst = Scattered(8, 64, 6)};
  ASSERT_NO_FATAL_FAILURE(Start(cluster, r, /*senders_first=*/true));
  r.receivers[1]->Abort();
  ASSERT_EQ(r.receivers[1]->Poll(), KVPoll::kFailed);
  const FailureRecord want = *r.receivers[1]->Failure();
  EXPECT_EQ(want.cause, FailureCause::kAborted);
  // decode tp0 shares no connection with decode tp1, and prefill tp0 feeds
  // only decode tp0: both learn it from the registry.
  for (auto* rx : {r.receivers[0].get()}) {
    ASSERT_TRUE(WaitFor([&] { return rx->Poll() == KVPoll::kFailed; })) << "decode tp0";
    ExpectSameRecord(*rx->Failure(), want);
  }
  for (size_t i = 0; i < r.senders.size(); ++i) {
    ASSERT_TRUE(WaitFor([&] { return r.senders[i]->Poll() == KVPoll::kFailed; }))
        << "prefill tp" << i;
    ExpectSameRecord(*r.senders[i]->Failure(), want);
  }
  for (auto& rx : r.receivers) EXPECT_TRUE(WaitFor([&] { return rx->Quiesced(); }));
  // Nothing but the request failed: a new one succeeds on every rank.
  Request next{.room = 42, .src = Scattered(4, 64, 7), .dst = Scattered(4, 64, 8)};
  ASSERT_NO_FATAL_FAILURE(Start(cluster, next, /*senders_first=*/false));
  ASSERT_NO_FATAL_FAILURE(SendChunks(next, {4}));
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(cluster, next));
}

// KVSender::Reject (sglang's wrong-dp-rank dispatch): the rejecting prefill
// rank's reason, not a generic abort, is what every decode receiver of the
// room fails with, naming that rank.
TEST(GroupFailureTest, ARejectOnOnePrefillRankFailsEveryDecodeReceiverNamingItAndTheReason) {
  auto c = TestCluster::Create(TwoByTwo());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  TestCluster& cluster = **c;
  Request r{.room = 51, .src = Scattered(8, 64, 15), .dst = Scattered(8, 64, 16)};
  ASSERT_NO_FATAL_FAILURE(Start(cluster, r, /*senders_first=*/false));
  const std::string reason = "room 51 belongs to prefill dp rank 3, not this one";
  r.senders[1]->Reject(reason);
  ASSERT_EQ(r.senders[1]->Poll(), KVPoll::kFailed);
  const FailureRecord want = *r.senders[1]->Failure();
  const RankId rejecting = cluster.prefill[1].manager->self();
  EXPECT_EQ(want.cause, FailureCause::kInvalidRequest);
  EXPECT_EQ(want.detail, reason);
  EXPECT_TRUE(want.origin.SameRank(rejecting)) << want.Message();
  for (size_t i = 0; i < r.receivers.size(); ++i) {
    KVReceiver& rx = *r.receivers[i];
    ASSERT_TRUE(WaitFor([&] { return rx.Poll() == KVPoll::kFailed; })) << "decode tp" << i;
    const FailureRecord got = *rx.Failure();
    ExpectSameRecord(got, want);
    EXPECT_EQ(got.room, r.room);
    EXPECT_EQ(got.code(), StatusCode::kInvalidArgument) << got.Message();
    // What an operator reads on decode names the prefill rank and why.
    EXPECT_NE(got.Message().find(rejecting.ShortName()), std::string::npos) << got.Message();
    EXPECT_NE(got.Message().find(reason), std::string::npos) << got.Message();
  }
  // The other prefill rank fails the request too, with the same record.
  ASSERT_TRUE(WaitFor([&] { return r.senders[0]->Poll() == KVPoll::kFailed; }));
  ExpectSameRecord(*r.senders[0]->Failure(), want);
}

// KVReceiver::Reject (a request decode cannot serve as asked, e.g. sglang's
// HiSparse device pages), before any metadata was sent: every prefill
// sender of the room and the other decode receiver fail with that rank's
// reason, not a generic abort and not at their metadata deadline.
TEST(GroupFailureTest, ARejectOnOneDecodeRankBeforeMetadataFailsEveryRankWithTheReason) {
  auto c = TestCluster::Create(TwoByTwo());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  TestCluster& cluster = **c;
  Request r{.room = 52};
  for (auto& p : cluster.prefill)
    r.senders.push_back(std::move(KVSender::Create(*p.manager, r.room)).value());
  for (auto& d : cluster.decode) {
    r.receivers.push_back(std::move(KVReceiver::Create(*d.manager, r.room)).value());
    ASSERT_TRUE(r.receivers.back()->Init(0).ok());
  }
  for (auto& rx : r.receivers)
    ASSERT_TRUE(WaitFor([&] { return rx->Poll() == KVPoll::kWaitingForInput; }))
        << KVPollName(rx->Poll());
  // Longer than a record takes (the registry and peers refuse one past it),
  // with a two-byte character across the limit: cut before it, still told.
  const std::string head = "device_kv_indices are not carried by kvbridge ";
  std::string reason =
      head + std::string(kMaxRecordTextBytes - head.size() - 1, 'x') + "\xC3\xA9tail";
  r.receivers[0]->Reject(reason);
  ASSERT_EQ(r.receivers[0]->Poll(), KVPoll::kFailed);
  const FailureRecord want = *r.receivers[0]->Failure();
  EXPECT_EQ(want.cause, FailureCause::kInvalidRequest);
  EXPECT_EQ(want.detail, reason.substr(0, kMaxRecordTextBytes - 1));
  EXPECT_TRUE(want.origin.SameRank(cluster.decode[0].manager->self())) << want.Message();
  for (size_t i = 0; i < r.senders.size(); ++i) {
    ASSERT_TRUE(WaitFor([&] { return r.senders[i]->Poll() == KVPoll::kFailed; }))
        << "prefill tp" << i;
    ExpectSameRecord(*r.senders[i]->Failure(), want);
  }
  ASSERT_TRUE(WaitFor([&] { return r.receivers[1]->Poll() == KVPoll::kFailed; }));
  ExpectSameRecord(*r.receivers[1]->Failure(), want);
}

TEST(GroupFailureTest, ARankThatSucceededNamesWhyItsGroupFailed) {
  std::vector<FaultTransport*> faults;
  auto c = TestCluster::Create(TwoByTwo(&faults));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  TestCluster& cluster = **c;
  Request r{.room = 43, .src = Scattered(8, 64, 9), .dst = Scattered(8, 64, 10)};
  ASSERT_NO_FATAL_FAILURE(Start(cluster, r, /*senders_first=*/false));
  // prefill tp1's writes (to decode tp1) wait; decode tp0's complete.
  faults[1]->HoldWrites();
  ASSERT_NO_FATAL_FAILURE(SendChunks(r, {8}));
  ASSERT_TRUE(WaitFor([&] { return r.receivers[0]->Poll() == KVPoll::kSuccess; }));
  r.receivers[1]->Abort();
  const FailureRecord want = *r.receivers[1]->Failure();
  faults[1]->ReleaseHeldWrites();
  ASSERT_NO_FATAL_FAILURE(AwaitRoomRecord(cluster, r.room));
  // The group's MIN is Failed; decode tp0's own room stays Success (final)
  // and holds no record of its own, yet it can say why.
  EXPECT_EQ(r.receivers[0]->Poll(), KVPoll::kSuccess);
  EXPECT_FALSE(r.receivers[0]->Failure().has_value());
  FailureRecord got = r.receivers[0]->GroupFailure();
  ExpectSameRecord(got, want);
  EXPECT_EQ(got.room, r.room);
  // The rank that failed answers with its own record at once.
  FailureRecord own = r.receivers[1]->GroupFailure();
  EXPECT_EQ(own.detail, want.detail);
  EXPECT_FALSE(own.is_from_another_rank);
}

TEST(GroupFailureTest, ARoomRecordIsNotARankDeathAndDoesNotFailALaterUseOfTheRoom) {
  auto c = TestCluster::Create(TwoByTwo());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  TestCluster& cluster = **c;
  Request r{.room = 44, .src = Scattered(4, 64, 11), .dst = Scattered(4, 64, 12)};
  ASSERT_NO_FATAL_FAILURE(Start(cluster, r, /*senders_first=*/true));
  r.receivers[0]->Abort();
  for (auto& s : r.senders) ASSERT_TRUE(WaitFor([&] { return s->Poll() == KVPoll::kFailed; }));
  ASSERT_TRUE(WaitFor([&] { return r.receivers[1]->Poll() == KVPoll::kFailed; }));
  for (auto& rx : r.receivers) ASSERT_TRUE(WaitFor([&] { return rx->Quiesced(); }));
  r.senders.clear();
  r.receivers.clear();
  // The same room id again, after the record: a new request, not failed by
  // the old record (every rank has read it: each failed its room with it).
  Request again{.room = 44, .src = Scattered(4, 64, 13), .dst = Scattered(4, 64, 14)};
  ASSERT_NO_FATAL_FAILURE(Start(cluster, again, /*senders_first=*/false));
  ASSERT_NO_FATAL_FAILURE(SendChunks(again, {4}));
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(cluster, again));
  // The registry lists every rank alive: an abort is not a death.
  auto client = BootstrapClient::Create(cluster.server->address(), std::chrono::milliseconds(2000),
                                        AuthTokenFromEnvironment());
  ASSERT_TRUE(client.ok());
  auto ranks = (*client)->ListRanks();
  ASSERT_TRUE(ranks.ok());
  EXPECT_EQ(ranks->size(), 4u);
  for (const RankStatus& s : *ranks) EXPECT_EQ(s.dead_by_seq, 0u) << s.record.attn_tp_rank;
}

// Review finding: a record's detected_at is the word of the rank that
// published it, in the registry as from a peer. One dated a day ahead
// fails the request it names, as it should, but then matched every later
// use of the room id (SameRequest): asked why its group failed, a later
// use named that record and failed with it. Read from the registry, a
// record is now dated no later than the reading, as a peer's word already
// was (DatedNoLaterThan).
TEST(GroupFailureTest, ARegistryRecordDatedInTheFutureIsNotWhyALaterUseOfTheRoomFailed) {
  ClusterOptions o;
  o.tweak = TolerantLiveness;
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  TestCluster& cluster = **c;
  KVManager& prefill = *cluster.prefill[0].manager;
  KVManager& decode = *cluster.decode[0].manager;
  // The first use of the room: a sender without metadata and a receiver
  // not initialized, so that neither tells the other anything: each learns
  // of the failure from the registry only.
  const uint64_t room = 45;
  auto tx = std::move(KVSender::Create(prefill, room)).value();
  auto rx = std::move(KVReceiver::Create(decode, room)).value();
  // A request's failure at prefill, published by a registered rank (one
  // PublishDeath registers for it) and dated a day ahead.
  FailureRecord planted = DeathOf(prefill.self());
  planted.cause = FailureCause::kInvalidRequest;
  planted.detail = "dated a day ahead";
  planted.mechanism = "Reject()";
  planted.room = room;
  planted.detected_at += std::chrono::hours(24);
  ASSERT_NO_FATAL_FAILURE(PublishDeath(cluster.bootstrap_address(), decode.self(), planted));
  // The barrier: each rank read it from the registry and failed its room.
  ASSERT_TRUE(WaitFor([&] { return tx->Poll() == KVPoll::kFailed; })) << KVPollName(tx->Poll());
  EXPECT_EQ(tx->Failure()->detail, planted.detail);
  ASSERT_TRUE(WaitFor([&] { return rx->Poll() == KVPoll::kFailed; })) << KVPollName(rx->Poll());
  EXPECT_EQ(rx->Failure()->detail, planted.detail);
  tx.reset();
  rx.reset();

  // The next use of the room id: no rank published anything about it.
  Request again{.room = room, .src = Scattered(4, 64, 17), .dst = Scattered(4, 64, 18)};
  ASSERT_NO_FATAL_FAILURE(Start(cluster, again, /*senders_first=*/false));
  const FailureRecord why = again.receivers[0]->FailAsGroup();
  EXPECT_NE(why.detail, planted.detail) << why.Message();
  ASSERT_EQ(again.receivers[0]->Poll(), KVPoll::kFailed);
  EXPECT_NE(again.receivers[0]->Failure()->detail, planted.detail)
      << again.receivers[0]->Failure()->Message();
}

// Init leaves the lookups to the resolver thread, so an abort right after
// it (the first request: nothing met yet) comes before the request's prefill
// ranks are known, and the receiver is released at once. The resolver still
// resolves that failed, released room once, only to tell its prefill ranks:
// a sender created after all that fails at once with decode's abort, not at
// its metadata deadline (60 s here) naming itself. (With failed rooms left
// out of RetryUnresolved this test fails, and so does the process test
// Connector.AbortMidTransferQuiescesBeforeReuse.)
TEST(GroupFailureTest, AnAbortRightAfterInitReachesASenderCreatedAfterTheRelease) {
  ClusterOptions o;
  o.tweak = [](ManagerOptions& m) {
    TolerantLiveness(m);
    m.waiting_timeout = std::chrono::seconds(60);
  };
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  {
    auto rx = std::move(KVReceiver::Create(*(*c)->decode[0].manager, 5)).value();
    ASSERT_TRUE(rx->Init(0).ok());
    rx->Abort();
    EXPECT_TRUE(rx->Quiesced());  // no metadata left: nothing can be written
  }
  auto tx = std::move(KVSender::Create(*(*c)->prefill[0].manager, 5)).value();
  ASSERT_TRUE(WaitFor([&] { return tx->Poll() == KVPoll::kFailed; }, std::chrono::seconds(20)))
      << KVPollName(tx->Poll());
  ASSERT_TRUE(tx->Failure().has_value());
  EXPECT_EQ(tx->Failure()->cause, FailureCause::kAborted) << tx->Failure()->Message();
  EXPECT_EQ(tx->Failure()->origin.ShortName(), "decode tp0") << tx->Failure()->Message();
}

// The same, with the room id used again before the failed use resolved: the
// late notice must not fail the new request, whose sender has no metadata
// yet and cannot tell the two uses apart. Decode reaches the registry
// through a stalled proxy, so neither use resolves until it resumes; the
// first is aborted and released, the second created, and prefill's sender
// of the room is waiting when both resolve. Barrier: decode's log says the
// first use's prefill ranks were not told. (Telling them, as before, fails
// the new request's sender with the old abort.)
TEST(GroupFailureTest, ALateNoticeOfAFailedUseSparesTheRoomsNextUse) {
  std::unique_ptr<StallProxy> proxy;
  auto c = TestCluster::Create(DecodeBehindAStallProxy(&proxy, std::chrono::seconds(60)));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  TestCluster& cluster = **c;
  ASSERT_TRUE(proxy && proxy->ok());
  testing::LogCapture log;
  proxy->Stall();
  {
    auto first = std::move(KVReceiver::Create(*cluster.decode[0].manager, 9)).value();
    ASSERT_TRUE(first->Init(0).ok());
    first->Abort();
    ASSERT_EQ(first->Poll(), KVPoll::kFailed);
  }
  Request r{.room = 9, .src = Scattered(4, 64, 21), .dst = Scattered(4, 64, 22)};
  r.receivers.push_back(std::move(KVReceiver::Create(*cluster.decode[0].manager, 9)).value());
  ASSERT_TRUE(r.receivers[0]->Init(0).ok());
  r.senders.push_back(std::move(KVSender::Create(*cluster.prefill[0].manager, 9)).value());
  proxy->Resume();
  ASSERT_TRUE(WaitFor([&] { return !log.Matching("the room id is in use again").empty(); },
                      std::chrono::seconds(20)))
      << "the failed use's prefill ranks were told, or it never resolved";
  ASSERT_TRUE(WaitFor([&] { return r.receivers[0]->Poll() == KVPoll::kWaitingForInput; },
                      std::chrono::seconds(20)))
      << KVPollName(r.receivers[0]->Poll());
  ASSERT_NE(r.senders[0]->Poll(), KVPoll::kFailed) << r.senders[0]->Failure()->Message();
  ASSERT_TRUE(r.receivers[0]->SendMetadata(r.dst, r.dst_aux, r.dst_state).ok());
  cluster.prefill[0].pool->Fill(r.room, r.src, r.src_aux, r.src_state);
  ASSERT_TRUE(WaitFor([&] { return r.senders[0]->Poll() == KVPoll::kWaitingForInput; }))
      << KVPollName(r.senders[0]->Poll())
      << (r.senders[0]->Failure() ? ": " + r.senders[0]->Failure()->Message() : "");
  ASSERT_TRUE(r.senders[0]->Init(r.src.size(), r.src_aux).ok());
  ASSERT_NO_FATAL_FAILURE(SendChunks(r, {4}));
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(cluster, r));
}

// Records queued while the registry does not answer are kept, not dropped:
// a publish that times out (kUnavailable) leaves it and every record queued
// after it for a later round (PublishQueued). Decode reaches the registry
// through a proxy that stops answering; three aborts of receivers no
// prefill sender holds yet (so only decode publishes their records) queue
// three room records; once a publish has failed (the log says so) the
// proxy answers again and the registry must come to hold all three. The
// heartbeat limit is high: no rank counts the registry lost meanwhile.
TEST(GroupFailureTest, RoomRecordsQueuedWhileTheRegistryDoesNotAnswerAllReachItAfterwards) {
  std::unique_ptr<StallProxy> proxy;
  auto c = TestCluster::Create(DecodeBehindAStallProxy(&proxy, ManagerOptions{}.waiting_timeout));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  TestCluster& cluster = **c;
  ASSERT_TRUE(proxy && proxy->ok());
  std::vector<std::unique_ptr<KVReceiver>> receivers;
  for (uint64_t room = 61; room <= 63; ++room) {
    receivers.push_back(std::move(KVReceiver::Create(*cluster.decode[0].manager, room)).value());
    ASSERT_TRUE(receivers.back()->Init(0).ok());
  }
  for (auto& rx : receivers)
    ASSERT_TRUE(WaitFor([&] { return rx->Poll() == KVPoll::kWaitingForInput; }))
        << KVPollName(rx->Poll());
  testing::LogCapture log;
  proxy->Stall();
  for (auto& rx : receivers) {
    rx->Abort();
    ASSERT_EQ(rx->Poll(), KVPoll::kFailed);
  }
  // The barrier: a publish timed out (2 s) while the proxy was stalled.
  ASSERT_TRUE(WaitFor([&] { return !log.Matching("failure record not published").empty(); },
                      std::chrono::seconds(20)))
      << "no publish was tried while the registry did not answer";
  // The operator sees them wait (those queued and those a publish took).
  ManagerImpl& decode = ManagerAccess::Of(*cluster.decode[0].manager);
  EXPECT_EQ(decode.Stats().failure_records_unpublished, 3u);
  proxy->ResumeDroppingHeld();  // the publish that timed out does not land late
  for (uint64_t room = 61; room <= 63; ++room)
    ASSERT_NO_FATAL_FAILURE(AwaitRoomRecord(cluster, room)) << "room " << room;
  EXPECT_TRUE(WaitFor([&] { return decode.Stats().failure_records_unpublished == 0; }))
      << decode.Stats().failure_records_unpublished << " still unpublished";
}

}  // namespace
}  // namespace kvbridge::internal
