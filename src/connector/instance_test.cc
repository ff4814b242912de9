// Several decode instances against one prefill instance (1P2D): their ranks
// share positions (decode tp0 twice), told apart by
// ManagerOptions::instance_id. A failure stays within the failed rank's
// instance; the other instance keeps serving.
#include <gtest/gtest.h>

#include "connector/connector_test_util.h"
#include "connector/protocol.h"
#include "connector/test_cluster.h"

namespace kvbridge::internal {
namespace {

// A prefill tp1 instance and decode instance "a" (tp2) from TestCluster,
// plus decode instance "b" (tp2) on the same fabric and bootstrap server.
struct TwoDecodeInstances {
  ClusterOptions options;
  std::unique_ptr<TestCluster> cluster;
  std::vector<ClusterRank> b;

  std::vector<ClusterRank>& a() { return cluster->decode; }
  ClusterRank& prefill() { return cluster->prefill[0]; }

  Status Start() {
    options.decode_tp = 2;
    options.tweak = [](ManagerOptions& m) {
      TolerantLiveness(m);
      if (m.role == Role::kDecode) m.instance_id = "a";
    };
    KVB_ASSIGN_OR_RETURN(cluster, TestCluster::Create(options));
    for (int tp = 0; tp < 2; ++tp) {
      PoolOptions po;
      po.shape = options.shape;
      po.tp_size = 2;
      po.tp_rank = tp;
      po.num_pages = options.num_pages;
      ClusterRank r;
      KVB_ASSIGN_OR_RETURN(r.pool, KvPool::Create(po));
      ManagerOptions mo;
      mo.role = Role::kDecode;
      mo.args = r.pool->Args();
      mo.parallel.tp_size = 2;
      mo.parallel.tp_rank = tp;
      mo.bootstrap_addr = cluster->bootstrap_address();
      mo.start_bootstrap_server = false;
      mo.instance_id = "b";
      TolerantLiveness(mo);
      KVB_ASSIGN_OR_RETURN(
          std::unique_ptr<Transport> t,
          CreateLoopbackTransport(cluster->fabric(), "decode[b] tp" + std::to_string(tp)));
      KVB_ASSIGN_OR_RETURN(r.manager, CreateManager(mo, std::move(t)));
      b.push_back(std::move(r));
    }
    return Status();
  }

  ~TwoDecodeInstances() {
    for (auto& r : b) r.manager.reset();
  }
};

struct Request {
  Request(uint64_t r, std::vector<ClusterRank>* d) : room(r), decode(d) {}
  uint64_t room;
  std::vector<ClusterRank>* decode;
  std::vector<int32_t> src{1, 2, 3, 4}, dst{10, 11, 12, 13};
  int64_t src_aux = 0;  // prefill's aux row: its own for each request in flight
  std::unique_ptr<KVSender> sender;
  std::vector<std::unique_ptr<KVReceiver>> receivers;
};

// Receivers on every rank of the request's decode instance, then the
// sender; waits for WaitingForInput and calls Init.
void Open(ClusterRank& prefill, Request& r) {
  for (auto& d : *r.decode) {
    r.receivers.push_back(std::move(KVReceiver::Create(*d.manager, r.room)).value());
    ASSERT_TRUE(r.receivers.back()->Init(0).ok());
    ASSERT_TRUE(r.receivers.back()->SendMetadata(r.dst, 0, {}).ok());
  }
  r.sender = std::move(KVSender::Create(*prefill.manager, r.room)).value();
  prefill.pool->Fill(r.room, r.src, r.src_aux, {});
  ASSERT_TRUE(WaitFor([&] { return r.sender->Poll() == KVPoll::kWaitingForInput; }))
      << KVPollName(r.sender->Poll())
      << (r.sender->Failure() ? ": " + r.sender->Failure()->Message() : "");
  ASSERT_TRUE(r.sender->Init(r.src.size(), r.src_aux).ok());
}

void SendAndExpectDelivered(Request& r) {
  ASSERT_TRUE(r.sender->Send(r.src, {}).ok());
  ASSERT_TRUE(WaitFor([&] {
    if (r.sender->Poll() != KVPoll::kSuccess) return false;
    for (auto& d : r.receivers)
      if (d->Poll() != KVPoll::kSuccess) return false;
    return true;
  })) << "room "
      << r.room << ": sender " << KVPollName(r.sender->Poll())
      << (r.sender->Failure() ? ": " + r.sender->Failure()->Message() : "");
  for (size_t i = 0; i < r.decode->size(); ++i) {
    EXPECT_EQ((*r.decode)[i].pool->CountCorruptPages(r.room, r.dst), 0u) << "tp" << i;
    EXPECT_TRUE((*r.decode)[i].pool->AuxMatches(r.room, 0)) << "tp" << i;
  }
}

TEST(DecodeInstancesTest, TwoInstancesAtTheSamePositionsBothDeliver) {
  TwoDecodeInstances c;
  ASSERT_TRUE(c.Start().ok());
  EXPECT_EQ(c.a()[1].manager->self().ShortName(), "decode[a] tp1");
  EXPECT_EQ(c.b[1].manager->self().ShortName(), "decode[b] tp1");
  Request ra(1, &c.a());
  Request rb(2, &c.b);
  rb.src = {5, 6, 7, 8};  // both in flight at once: their own source pages and aux row
  rb.src_aux = 1;
  rb.dst = {20, 21, 22, 23};
  Open(c.prefill(), ra);
  Open(c.prefill(), rb);
  SendAndExpectDelivered(ra);
  SendAndExpectDelivered(rb);
  EXPECT_EQ(c.prefill().manager->Stats().peers_connected, 4u);
}

TEST(DecodeInstancesTest, AFailedRankFailsOnlyItsOwnInstance) {
  TwoDecodeInstances c;
  ASSERT_TRUE(c.Start().ok());
  Request ra(1, &c.a());
  Request rb(2, &c.b);
  rb.src = {5, 6, 7, 8};
  rb.src_aux = 1;
  Open(c.prefill(), ra);
  Open(c.prefill(), rb);
  const RankId victim = c.b[1].manager->self();
  c.b[1].manager->ReportFatal("CUDA out of memory");  // a dead rank to every other

  // Instance b: prefill's sender of b's request and b's surviving sibling
  // name decode[b] tp1.
  ASSERT_TRUE(WaitFor([&] { return rb.sender->Poll() == KVPoll::kFailed; }));
  EXPECT_TRUE(rb.sender->Failure()->origin.SameRank(victim)) << rb.sender->Failure()->Message();
  ASSERT_TRUE(WaitFor([&] { return rb.receivers[0]->Poll() == KVPoll::kFailed; }));
  EXPECT_TRUE(rb.receivers[0]->Failure()->origin.SameRank(victim))
      << rb.receivers[0]->Failure()->Message();
  EXPECT_NE(rb.receivers[0]->Failure()->Message().find("decode[b] tp1"), std::string::npos);
  // A new request on b fails (after its restart check), naming the missing sibling.
  auto late = std::move(KVReceiver::Create(*c.b[0].manager, 4)).value();
  ASSERT_TRUE(WaitFor([&] { return late->Poll() == KVPoll::kFailed; }));
  EXPECT_TRUE(late->Failure()->origin.SameRank(victim)) << late->Failure()->Message();

  // Instance a: its request in flight completes, and prefill keeps taking
  // new ones from it.
  SendAndExpectDelivered(ra);
  Request again(3, &c.a());
  again.dst = {30, 31, 32, 33};
  Open(c.prefill(), again);
  SendAndExpectDelivered(again);
  for (auto& d : c.a()) EXPECT_EQ(d.manager->Stats().rooms_failed, 0u);
}

// Room ids are the application's; a request is read by one decode instance
// and dp (the one whose metadata came first). Another instance's metadata
// for the same room id took the request's missing tp1 flow (prefill would
// have written a's KV into b's pages), and its failure notice failed a's
// request. Now b's request is refused, saying why, and a's goes through.
class SameRoomIdTest : public ::testing::TestWithParam<bool> {};  // sglang's server

TEST_P(SameRoomIdTest, AnotherInstanceUsingTheSameRoomIdChangesNothingInTheRequest) {
  TwoDecodeInstances c;
  c.options.sglang_server = GetParam();
  ASSERT_TRUE(c.Start().ok());
  KVManager& prefill = *c.prefill().manager;
  Request ra(7, &c.a());
  ra.sender = std::move(KVSender::Create(prefill, ra.room)).value();
  c.prefill().pool->Fill(ra.room, ra.src, ra.src_aux, {});
  auto open = [](ClusterRank& d, Request& r) {
    r.receivers.push_back(std::move(KVReceiver::Create(*d.manager, r.room)).value());
    ASSERT_TRUE(r.receivers.back()->Init(0).ok());
    ASSERT_TRUE(r.receivers.back()->SendMetadata(r.dst, 0, {}).ok());
  };
  ASSERT_NO_FATAL_FAILURE(open(c.a()[0], ra));
  ASSERT_TRUE(WaitFor([&] { return ra.sender->DecodePrefixPages() != -1; }));  // a tp0's came

  const std::vector<int32_t> b_pages{40, 41, 42, 43};
  c.b[1].pool->Scrub(b_pages, 0xAB);
  Request rb(7, &c.b);
  rb.dst = b_pages;
  ASSERT_NO_FATAL_FAILURE(open(c.b[1], rb));
  ASSERT_TRUE(WaitFor([&] { return rb.receivers[0]->Poll() == KVPoll::kFailed; }))
      << KVPollName(rb.receivers[0]->Poll());
  const FailureRecord why = *rb.receivers[0]->Failure();
  EXPECT_EQ(why.cause, FailureCause::kInvalidRequest);
  EXPECT_TRUE(why.origin.SameRank(prefill.self())) << why.Message();
  EXPECT_NE(why.detail.find("room 7 is already a request of decode[a] dp0"), std::string::npos)
      << why.Message();
  // b tp1's own failure notice for that room, as it sends one: then a
  // barrier on the same ordered endpoint (metadata for a room with no
  // sender is held once the notice before it was handled).
  Transport& t = ManagerAccess::Of(*c.b[1].manager).transport();
  const PeerId to_prefill = ProvenEndpoint(*c.b[1].manager, prefill.self());
  FailureRecord aborted = why;
  aborted.origin = c.b[1].manager->self();
  aborted.cause = FailureCause::kAborted;
  ASSERT_TRUE(
      t.SendMessage(to_prefill,
                    EncodeMessage(c.b[1].manager->self(),
                                  RoomFailedMsg{7, rb.receivers[0]->generation(), false, aborted}))
          .ok());
  MetaMsg marker;
  marker.room = 99;
  marker.generation = 1;
  marker.decode_tp_size = 2;
  marker.pages = {50};
  ASSERT_TRUE(t.SendMessage(to_prefill, EncodeMessage(c.b[1].manager->self(), marker)).ok());
  ASSERT_TRUE(WaitFor([&] { return prefill.Stats().pending_metadata == 1u; }));
  EXPECT_EQ(ra.sender->Poll(), KVPoll::kBootstrapping)
      << (ra.sender->Failure() ? ra.sender->Failure()->Message() : "");

  ASSERT_NO_FATAL_FAILURE(open(c.a()[1], ra));
  ASSERT_TRUE(WaitFor([&] { return ra.sender->Poll() == KVPoll::kWaitingForInput; }))
      << KVPollName(ra.sender->Poll())
      << (ra.sender->Failure() ? ": " + ra.sender->Failure()->Message() : "");
  ASSERT_TRUE(ra.sender->Init(ra.src.size(), ra.src_aux).ok());
  SendAndExpectDelivered(ra);
  EXPECT_TRUE(c.b[1].pool->PagesHold(b_pages, 0xAB));
}

// A room id whose request here already ended is free for another decode
// group's next request: its metadata waits for the next sender.
TEST_P(SameRoomIdTest, AnotherInstancesNextUseOfAnEndedRoomIdGoesThrough) {
  TwoDecodeInstances c;
  c.options.sglang_server = GetParam();
  ASSERT_TRUE(c.Start().ok());
  Request ra(8, &c.a());
  Open(c.prefill(), ra);
  SendAndExpectDelivered(ra);  // a's sender stays, at Success
  Request rb(8, &c.b);
  rb.dst = {20, 21, 22, 23};
  for (auto& d : c.b) {
    rb.receivers.push_back(std::move(KVReceiver::Create(*d.manager, rb.room)).value());
    ASSERT_TRUE(rb.receivers.back()->Init(0).ok());
    ASSERT_TRUE(rb.receivers.back()->SendMetadata(rb.dst, 0, {}).ok());
  }
  KVManager& prefill = *c.prefill().manager;
  ASSERT_TRUE(WaitFor([&] { return prefill.Stats().pending_metadata == 2u; }));
  ra.sender.reset();
  rb.sender = std::move(KVSender::Create(prefill, rb.room)).value();
  c.prefill().pool->Fill(rb.room, rb.src, rb.src_aux, {});
  ASSERT_TRUE(WaitFor([&] { return rb.sender->Poll() == KVPoll::kWaitingForInput; }))
      << KVPollName(rb.sender->Poll())
      << (rb.sender->Failure() ? ": " + rb.sender->Failure()->Message() : "");
  ASSERT_TRUE(rb.sender->Init(rb.src.size(), rb.src_aux).ok());
  SendAndExpectDelivered(rb);
}

INSTANTIATE_TEST_SUITE_P(Registry, SameRoomIdTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "sglang" : "kvbridge"; });

TEST(DecodeInstancesTest, AnInstanceIdOutsideTheAllowedCharactersIsRefused) {
  ClusterOptions o;
  o.tweak = [](ManagerOptions& m) {
    if (m.role == Role::kDecode) m.instance_id = "decode b";
  };
  auto c = TestCluster::Create(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("instance_id 'decode b'"), std::string::npos)
      << c.status().ToString();
}

}  // namespace
}  // namespace kvbridge::internal
