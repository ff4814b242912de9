#include <gtest/gtest.h>

#include <set>

#include "connector/connector_test_util.h"
#include "connector/manager_impl.h"
#include "connector/protocol.h"
#include "connector/test_cluster.h"

namespace kvbridge::internal {
namespace {

struct TpCase {
  int prefill_tp;
  int decode_tp;
  int heads;
  bool mla;
};

class ConnectorTpTest : public ::testing::TestWithParam<TpCase> {};

TEST_P(ConnectorTpTest, ChunkedTransferLandsEveryByte) {
  const TpCase& tc = GetParam();
  ClusterOptions o;
  o.prefill_tp = tc.prefill_tp;
  o.decode_tp = tc.decode_tp;
  o.shape.total_kv_heads = tc.heads;
  o.shape.mla = tc.mla;
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Request r{.room = 42};
  r.src = Scattered(12, o.num_pages, 1);
  r.dst = Scattered(12, o.num_pages, 2);
  Start(**c, r, /*senders_first=*/false);
  SendChunks(r, {5, 4, 3});  // chunked prefill: the chunk completing num_pages is last
  ExpectDelivered(**c, r);
  auto stats = (*c)->prefill[0].manager->Stats();
  EXPECT_GT(stats.write_ops, 0u);
  // Each decode byte was written once: replicated heads (MLA, or more ranks
  // than kv heads) are sent by one prefill rank, the aux row and state too.
  EXPECT_EQ(PrefillBytesWritten(**c), DecodeBytesNeeded(**c, r));
}

INSTANTIATE_TEST_SUITE_P(Layouts, ConnectorTpTest,
                         ::testing::Values(TpCase{1, 1, 4, false}, TpCase{2, 2, 4, false},
                                           TpCase{1, 2, 4, false}, TpCase{2, 1, 4, false},
                                           TpCase{4, 2, 4, false}, TpCase{2, 4, 2, false},
                                           TpCase{2, 2, 1, true}, TpCase{4, 2, 1, true},
                                           TpCase{1, 2, 1, true}),
                         [](const auto& info) {
                           return (info.param.mla ? std::string("mla") : std::string("mha")) +
                                  std::to_string(info.param.prefill_tp) + "to" +
                                  std::to_string(info.param.decode_tp) + "h" +
                                  std::to_string(info.param.heads);
                         });

TEST(ConnectorTest, EmptyLastChunkStillSendsAuxAndState) {
  auto c = TestCluster::Create(ClusterOptions{});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Request r{.room = 11};  // no pages at all: the one chunk is empty and last
  Start(**c, r, false);
  SendChunks(r, {0});
  ExpectDelivered(**c, r);
}

TEST(ConnectorTest, DecodePrefixPagesAreNotResent) {
  auto c = TestCluster::Create(ClusterOptions{});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const uint8_t kFiller = 0x5A;
  std::vector<int32_t> src = Scattered(6, 64, 3), dst_tail = {40, 41, 42, 43};
  std::vector<int32_t> prefix_pages = {50, 51};
  (*c)->decode[0].pool->Scrub(prefix_pages, kFiller);
  (*c)->prefill[0].pool->Fill(12, src, 1, {});
  auto recv = std::move(KVReceiver::Create(*(*c)->decode[0].manager, 12)).value();
  auto send = std::move(KVSender::Create(*(*c)->prefill[0].manager, 12)).value();
  ASSERT_TRUE(recv->Init(0).ok());
  // Decode already holds the first two pages (8 tokens) of the prompt.
  ASSERT_TRUE(recv->SendMetadata(dst_tail, 2, {}, /*decode_prefix_len=*/8).ok());
  ASSERT_TRUE(WaitFor([&] { return send->Poll() == KVPoll::kWaitingForInput; }));
  ASSERT_TRUE(send->Init(6, 1).ok());
  ASSERT_TRUE(send->Send(std::span(src).first(2)).ok());  // prefix only: nothing to write
  ASSERT_TRUE(send->Send(std::span(src).subspan(2)).ok());
  ASSERT_TRUE(WaitFor([&] { return recv->Poll() == KVPoll::kSuccess; }));
  EXPECT_EQ((*c)->decode[0].pool->CountCorruptPages(12, dst_tail, /*first_position=*/2), 0u);
  EXPECT_TRUE((*c)->decode[0].pool->AuxMatches(12, 2));
  EXPECT_TRUE((*c)->decode[0].pool->PagesHold(prefix_pages, kFiller));
}

TEST(ConnectorTest, MetadataBeforeSenderAndRoomReuse) {
  auto c = TestCluster::Create(ClusterOptions{});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  for (int round = 0; round < 3; ++round) {
    Request r{.room = 7};
    r.src = Scattered(6, 64, 10 + round);
    r.dst = Scattered(6, 64, 20 + round);
    Start(**c, r, /*senders_first=*/round % 2 == 1);
    SendChunks(r, {6});
    ExpectDelivered(**c, r);
  }
  auto s = (*c)->decode[0].manager->Stats();
  EXPECT_EQ(s.rooms_succeeded, 3u);
  EXPECT_EQ(s.rooms_failed, 0u);
}

TEST(ConnectorTest, ManyConcurrentRooms) {
  ClusterOptions o;
  o.num_pages = 512;
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<Request> reqs(100);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].room = 1000 + i;
    reqs[i].src = {static_cast<int32_t>(i * 4), static_cast<int32_t>(i * 4 + 1)};
    reqs[i].dst = {static_cast<int32_t>(511 - i * 4), static_cast<int32_t>(510 - i * 4)};
    reqs[i].src_aux = reqs[i].dst_aux = static_cast<int64_t>(i % 64);
    reqs[i].src_state = {static_cast<int32_t>(i % 64)};
    reqs[i].dst_state = {static_cast<int32_t>((i + 1) % 64)};
  }
  for (auto& r : reqs) Start(**c, r, false);
  for (auto& r : reqs) SendChunks(r, {2});
  for (auto& r : reqs) {
    ASSERT_TRUE(WaitFor([&] { return r.receivers[0]->Poll() == KVPoll::kSuccess; }));
    EXPECT_EQ((*c)->decode[0].pool->CountCorruptPages(r.room, r.dst), 0u);
  }
}

TEST(ConnectorTest, StaleGenerationIsDroppedNotApplied) {
  auto c = TestCluster::Create(ClusterOptions{});
  ASSERT_TRUE(c.ok());
  // A receiver aborted before prefill sent anything, then the room is reused.
  // Its metadata goes once the handshake is done (sglang's order), so the
  // abort reaches prefill before the room's next use begins.
  auto old = KVReceiver::Create(*(*c)->decode[0].manager, 9);
  ASSERT_TRUE(old.ok());
  std::vector<int32_t> pages{1, 2};
  ASSERT_TRUE((*old)->Init(0).ok());
  ASSERT_TRUE(WaitFor([&] { return (*old)->Poll() == KVPoll::kWaitingForInput; }));
  ASSERT_TRUE((*old)->SendMetadata(pages, 0, {}).ok());
  (*old)->Abort();
  ASSERT_TRUE(WaitFor([&] { return (*old)->Quiesced(); }));
  uint64_t old_gen = (*old)->generation();
  old->reset();
  // Prefill's sender for that request comes late: it fails at once with
  // decode's abort instead of waiting for metadata that will never come.
  auto old_sender = std::move(KVSender::Create(*(*c)->prefill[0].manager, 9)).value();
  ASSERT_TRUE(WaitFor([&] { return old_sender->Poll() == KVPoll::kFailed; }));
  EXPECT_EQ(old_sender->Failure()->cause, FailureCause::kAborted);
  EXPECT_EQ(old_sender->Failure()->origin.ShortName(), "decode tp0");
  old_sender.reset();
  Request r{.room = 9};
  r.src = {3, 4};
  r.dst = {5, 6};
  Start(**c, r, false);
  EXPECT_NE(r.receivers[0]->generation(), old_gen);
  SendChunks(r, {2});
  ExpectDelivered(**c, r);
}

// The reused room's metadata reaches prefill before its sender exists: the
// old request's failure (kept for the old request's late metadata) must not
// answer it.
TEST(ConnectorTest, ReusedRoomMetadataBeforeItsSenderIsNotFailedByTheOldAbort) {
  auto c = TestCluster::Create(ClusterOptions{});
  ASSERT_TRUE(c.ok());
  KVManager& prefill = *(*c)->prefill[0].manager;
  auto old = std::move(KVReceiver::Create(*(*c)->decode[0].manager, 9)).value();
  std::vector<int32_t> pages{1, 2};
  ASSERT_TRUE(old->Init(0).ok());
  ASSERT_TRUE(WaitFor([&] { return old->Poll() == KVPoll::kWaitingForInput; }));  // handshake done
  ASSERT_TRUE(old->SendMetadata(pages, 0, {}).ok());
  old->Abort();
  ASSERT_TRUE(WaitFor([&] { return old->Quiesced(); }));
  old.reset();
  auto old_sender = std::move(KVSender::Create(prefill, 9)).value();
  ASSERT_TRUE(WaitFor([&] { return old_sender->Poll() == KVPoll::kFailed; }));
  old_sender.reset();  // failed before any metadata: kept as an orphan failure

  Request r{.room = 9};
  r.src = {3, 4};
  r.dst = {5, 6};
  for (auto& d : (*c)->decode) {
    auto rc = std::move(KVReceiver::Create(*d.manager, r.room)).value();
    ASSERT_TRUE(rc->Init(0).ok());
    ASSERT_TRUE(rc->SendMetadata(r.dst, r.dst_aux, r.dst_state).ok());
    r.receivers.push_back(std::move(rc));
  }
  ASSERT_TRUE(WaitFor([&] { return prefill.Stats().pending_metadata == 1; }))
      << "receiver " << KVPollName(r.receivers[0]->Poll());
  EXPECT_NE(r.receivers[0]->Poll(), KVPoll::kFailed);
  r.senders.push_back(std::move(KVSender::Create(prefill, r.room)).value());
  (*c)->prefill[0].pool->Fill(r.room, r.src, r.src_aux, r.src_state);
  ASSERT_TRUE(WaitFor([&] { return r.senders[0]->Poll() == KVPoll::kWaitingForInput; }))
      << KVPollName(r.senders[0]->Poll());
  ASSERT_TRUE(r.senders[0]->Init(r.src.size(), r.src_aux).ok());
  SendChunks(r, {2});
  ExpectDelivered(**c, r);
}

// Decode failed a request and its notice reached prefill before the
// request's metadata (two decode threads flushed in the other order).
// Prefill has answered "quiesced" and decode took its pages back: the
// metadata that follows must never be adopted, whether the sender is live
// already or created afterwards, or its writes would land in those pages.
TEST(ConnectorTest, AbortThatOvertakesItsMetadataWinsOverIt) {
  auto c = TestCluster::Create(ClusterOptions{});
  ASSERT_TRUE(c.ok());
  Request warm{.room = 1};
  warm.src = {1, 2};
  warm.dst = {7, 8};
  Start(**c, warm, false);  // the handshake is done
  SendChunks(warm, {2});
  ExpectDelivered(**c, warm);
  KVManager& prefill = *(*c)->prefill[0].manager;
  KVManager& decode = *(*c)->decode[0].manager;
  // Decode's messages, in the order the race delivers them, on decode's own
  // (proven) endpoint to prefill.
  Transport& dt = ManagerAccess::Of(decode).transport();
  const PeerId to_prefill = ProvenEndpoint(decode, prefill.self());
  auto send = [&](const MessageBody& body) {
    ASSERT_TRUE(dt.SendMessage(to_prefill, EncodeMessage(decode.self(), body)).ok());
  };
  auto meta = [](uint64_t room, uint64_t generation) {
    MetaMsg m;
    m.room = room;
    m.generation = generation;
    m.pages = {5, 6};
    m.aux_index = 0;
    return m;
  };
  FailureRecord aborted;
  aborted.origin = decode.self();
  aborted.cause = FailureCause::kAborted;
  aborted.detail = "aborted by the application";
  aborted.phase = Phase::kWaitingForInput;
  aborted.detected_by = decode.self();
  aborted.mechanism = "Abort()";

  auto live = std::move(KVSender::Create(prefill, 20)).value();
  send(RoomFailedMsg{20, 7001, false, aborted});
  send(meta(20, 7001));
  ASSERT_TRUE(WaitFor([&] { return live->Poll() == KVPoll::kFailed; })) << KVPollName(live->Poll());
  EXPECT_EQ(live->Failure()->cause, FailureCause::kAborted);

  send(RoomFailedMsg{21, 7002, false, aborted});
  send(meta(21, 7002));
  send(meta(22, 7003));  // processed after the two above: a sync point
  ASSERT_TRUE(WaitFor([&] { return prefill.Stats().pending_metadata >= 1; }));
  EXPECT_EQ(prefill.Stats().pending_metadata, 1u) << "room 21's metadata was kept";
  auto late = std::move(KVSender::Create(prefill, 21)).value();
  ASSERT_TRUE(WaitFor([&] { return late->Poll() == KVPoll::kFailed; })) << KVPollName(late->Poll());
  EXPECT_EQ(late->Failure()->cause, FailureCause::kAborted);
}

TEST(ConnectorTest, SecondLiveReceiverOrSenderIsRefused) {
  auto c = TestCluster::Create(ClusterOptions{});
  ASSERT_TRUE(c.ok());
  auto a = KVReceiver::Create(*(*c)->decode[0].manager, 5);
  ASSERT_TRUE(a.ok());
  auto b = KVReceiver::Create(*(*c)->decode[0].manager, 5);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(b.status().message().find("room 5"), std::string::npos);
  auto s1 = KVSender::Create(*(*c)->prefill[0].manager, 5);
  ASSERT_TRUE(s1.ok());
  auto s2 = KVSender::Create(*(*c)->prefill[0].manager, 5);
  EXPECT_EQ(s2.status().code(), StatusCode::kFailedPrecondition);
  // Wrong side.
  EXPECT_EQ(KVSender::Create(*(*c)->decode[0].manager, 6).status().code(),
            StatusCode::kFailedPrecondition);
}

// A proven decode rank sends a request's metadata again, for the same
// generation and naming other pages (a bug, or a hostile rank): the first
// metadata stands, the request completes once into the pages it named, and
// the pages of the duplicate are never written.
TEST(ConnectorTest, DuplicateMetadataChangesNothing) {
  auto c = TestCluster::Create(ClusterOptions{});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  KVManager& decode = *(*c)->decode[0].manager;
  KVManager& prefill = *(*c)->prefill[0].manager;
  Request r{.room = 5, .src = {1, 2}, .dst = {3, 4}};
  Start(**c, r, false);
  const std::vector<int32_t> other{20, 21};
  (*c)->decode[0].pool->Scrub(other, 0xAB);
  Transport& t = ManagerAccess::Of(decode).transport();
  const PeerId to_prefill = ProvenEndpoint(decode, ManagerAccess::Of(prefill).self());
  MetaMsg dup;
  dup.room = r.room;
  dup.generation = r.receivers[0]->generation();
  dup.decode_tp_size = 1;
  dup.pages = other;
  dup.aux_index = r.dst_aux;
  ASSERT_TRUE(t.SendMessage(to_prefill, EncodeMessage(decode.self(), dup)).ok());
  // Barrier: metadata for a room with no sender, behind the duplicate on the
  // same ordered endpoint, is held once the duplicate was handled.
  MetaMsg marker = dup;
  marker.room = 6;
  ASSERT_TRUE(t.SendMessage(to_prefill, EncodeMessage(decode.self(), marker)).ok());
  ASSERT_TRUE(WaitFor([&] { return prefill.Stats().pending_metadata == 1; }));
  EXPECT_EQ(r.senders[0]->Poll(), KVPoll::kWaitingForInput);
  SendChunks(r, {2});
  ExpectDelivered(**c, r);
  EXPECT_TRUE((*c)->decode[0].pool->PagesHold(other, 0xAB));
  EXPECT_EQ(prefill.Stats().rooms_succeeded, 1u);
  EXPECT_EQ(prefill.Stats().rooms_failed, 0u);
}

// Sends `note` to decode as prefill tp0 would: sealed on prefill's proven
// endpoint, so decode takes it as that rank's.
void NoticeFromPrefill(TestCluster& c, const NotifyMsg& note) {
  KVManager& prefill = *c.prefill[0].manager;
  KVManager& decode = *c.decode[0].manager;
  Transport& t = ManagerAccess::Of(prefill).transport();
  const PeerId to_decode = ProvenEndpoint(prefill, decode.self());
  ASSERT_TRUE(t.SendMessage(to_decode, EncodeMessage(prefill.self(), note)).ok());
}

// A proven prefill rank's chunk notices out of order, or one repeated (a
// bug, or a hostile rank): the room fails at once, naming that rank and
// what came, and prefill's sender learns it; the real chunks it sent
// before change nothing.
TEST(ConnectorTest, AChunkNoticeOutOfOrderOrRepeatedFailsTheRoomNamingItsSender) {
  for (const bool repeated : {false, true}) {
    SCOPED_TRACE(repeated ? "a notice repeated" : "a notice ahead of its turn");
    auto c = TestCluster::Create(ClusterOptions{});
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    Request r{.room = 7, .src = {1, 2, 3}, .dst = {4, 5, 6}};
    Start(**c, r, false);
    KVReceiver& rx = *r.receivers[0];
    NotifyMsg note{r.room, rx.generation(), /*chunk=*/1, /*last=*/false, /*pages=*/1};
    if (repeated) {
      SendChunks(r, {1});  // chunk 0 of three pages, not the last
      ASSERT_TRUE(WaitFor([&] { return rx.Poll() == KVPoll::kTransferring; }));
      note.chunk = 0;
    }
    NoticeFromPrefill(**c, note);
    ASSERT_TRUE(WaitFor([&] { return rx.Poll() == KVPoll::kFailed; }));
    std::optional<FailureRecord> why = rx.Failure();
    ASSERT_TRUE(why.has_value());
    EXPECT_EQ(why->cause, FailureCause::kInvalidRequest) << why->Message();
    EXPECT_EQ(why->origin.ShortName(), "prefill tp0") << why->Message();
    EXPECT_NE(why->detail.find(repeated ? "chunk 0 arrived while chunk 1 was expected"
                                        : "chunk 1 arrived while chunk 0 was expected"),
              std::string::npos)
        << why->detail;
    ASSERT_TRUE(WaitFor([&] { return r.senders[0]->Poll() == KVPoll::kFailed; }));
    EXPECT_EQ(r.senders[0]->Failure()->cause, FailureCause::kInvalidRequest);
    EXPECT_EQ((*c)->decode[0].manager->Stats().rooms_succeeded, 0u);
  }
}

// The last chunk's notice again after the request succeeded: dropped as
// stale (the barrier), and Success stays.
TEST(ConnectorTest, TheLastNoticeAgainAfterSuccessChangesNothing) {
  auto c = TestCluster::Create(ClusterOptions{});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  KVManager& decode = *(*c)->decode[0].manager;
  Request r{.room = 8, .src = {1, 2}, .dst = {3, 4}};
  Start(**c, r, false);
  SendChunks(r, {1, 1});
  ExpectDelivered(**c, r);
  KVReceiver& rx = *r.receivers[0];
  const uint64_t stale = decode.Stats().stale_messages_dropped;
  NoticeFromPrefill(**c, NotifyMsg{r.room, rx.generation(), /*chunk=*/1, /*last=*/true, 1});
  ASSERT_TRUE(WaitFor([&] { return decode.Stats().stale_messages_dropped == stale + 1; }));
  EXPECT_EQ(rx.Poll(), KVPoll::kSuccess);
  EXPECT_FALSE(rx.Failure().has_value());
  EXPECT_EQ(decode.Stats().rooms_succeeded, 1u);
  EXPECT_EQ(decode.Stats().rooms_failed, 0u);
}

}  // namespace
}  // namespace kvbridge::internal
