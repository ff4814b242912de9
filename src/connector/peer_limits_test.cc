// Hostile sizes from a peer (issue 12, finding 7): a control message whose
// sizes break a limit, or disagree with what its sender declared at its
// handshake, is dropped and counted, and the requests around it carry on.
#include <gtest/gtest.h>

#include <functional>

#include "common/log_capture.h"
#include "connector/connector_test_util.h"
#include "connector/manager_impl.h"
#include "connector/protocol.h"
#include "connector/test_cluster.h"

namespace kvbridge::internal {
namespace {

class PeerLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = TestCluster::Create(ClusterOptions{});
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    cluster_ = std::move(c).value();
    Request warm{.room = 1};
    warm.src = {1, 2};
    warm.dst = {7, 8};
    Start(*cluster_, warm, false);  // the handshake is done: decode declared tp size 1
    SendChunks(warm, {2});
    ExpectDelivered(*cluster_, warm);
    // Decode's own endpoint to prefill, whose handshake proved it: what is
    // sent on it is sealed as decode's.
    to_prefill_ = ProvenEndpoint(decode(), prefill().self());
  }
  KVManager& prefill() { return *cluster_->prefill[0].manager; }
  KVManager& decode() { return *cluster_->decode[0].manager; }
  // Sends bytes to prefill as decode, on decode's own endpoint.
  void SendRaw(std::string bytes) {
    ASSERT_TRUE(
        ManagerAccess::Of(decode()).transport().SendMessage(to_prefill_, std::move(bytes)).ok());
  }
  uint64_t Invalid() { return prefill().Stats().invalid_messages_dropped; }

  std::unique_ptr<TestCluster> cluster_;
  PeerId to_prefill_ = 0;
};

MetaMsg Meta(uint64_t room, int decode_tp_size) {
  MetaMsg m;
  m.room = room;
  m.generation = 9001;
  m.decode_tp_size = decode_tp_size;
  m.pages = {5, 6};
  m.aux_index = 0;
  return m;
}

// A Meta claiming decode tp size 2 when decode's Hello said 1 used to be
// adopted: prefill planned flows to a decode tp1 that does not exist and the
// request waited for its metadata until its deadline. Now it is dropped; the
// real metadata that follows is adopted and the request succeeds.
TEST_F(PeerLimitsTest, MetaWhoseTpSizeIsNotItsHellosIsDroppedAndCounted) {
  const uint64_t before = Invalid();
  Request r{.room = 30};
  r.src = {1, 2, 3};
  r.dst = {9, 10, 11};
  r.senders.push_back(std::move(KVSender::Create(prefill(), r.room)).value());
  SendRaw(EncodeMessage(decode().self(), Meta(r.room, 2)));
  ASSERT_TRUE(WaitFor([&] { return Invalid() == before + 1; })) << Invalid() - before;
  EXPECT_EQ(r.senders[0]->Poll(), KVPoll::kBootstrapping);

  auto rc = KVReceiver::Create(decode(), r.room);
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  ASSERT_TRUE((*rc)->Init(0).ok());
  ASSERT_TRUE((*rc)->SendMetadata(r.dst, r.dst_aux, r.dst_state).ok());
  r.receivers.push_back(std::move(rc).value());
  cluster_->prefill[0].pool->Fill(r.room, r.src, r.src_aux, r.src_state);
  ASSERT_TRUE(WaitFor([&] { return r.senders[0]->Poll() == KVPoll::kWaitingForInput; }))
      << KVPollName(r.senders[0]->Poll());
  ASSERT_TRUE(r.senders[0]->Init(r.src.size(), r.src_aux).ok());
  SendChunks(r, {3});
  ExpectDelivered(*cluster_, r);
  EXPECT_EQ(Invalid(), before + 1);
}

// A decode tp size of 2^30 drove ComputeFlows (under the manager mutex) into
// allocating for a billion ranks: now the decoder refuses it. The message
// after it is a barrier: it is processed after the hostile one.
TEST_F(PeerLimitsTest, MetaWithHugeTpSizeNeverReachesThePlanner) {
  const uint64_t before = Invalid();
  auto sender = std::move(KVSender::Create(prefill(), 31)).value();
  SendRaw(EncodeMessage(decode().self(), Meta(31, 1 << 30)));
  SendRaw(EncodeMessage(decode().self(), Meta(31, 3)));
  ASSERT_TRUE(WaitFor([&] { return Invalid() == before + 2; })) << Invalid() - before;
  EXPECT_EQ(sender->Poll(), KVPoll::kBootstrapping);
  EXPECT_EQ(prefill().Stats().pending_metadata, 0u);
}

// A stream of handshake answers from a prefill rank whose handshake was
// answered long ago: refusals "as declared failed" (each would let decode's
// endpoint go and wake a registry round, were it taken) and verdicts of
// incompatibility (each would fail the peer as a layout mismatch), all with
// 16 KiB of text, newlines included. An answered session is not judged
// again: none is taken, none is logged, nothing fails, and the next request
// goes through on the same endpoint. A message decode cannot decode, sent
// after them on the same endpoint, is the barrier.
TEST_F(PeerLimitsTest, AStreamOfHandshakeAnswersAfterTheSessionWasAnsweredIsDropped) {
  const PeerId from_prefill = ProvenEndpoint(prefill(), decode().self());
  const PeerId decode_ep = ProvenEndpoint(decode(), prefill().self());
  const uint64_t before = decode().Stats().invalid_messages_dropped;
  testing::LogCapture log;
  std::string text(kMaxTextBytes, 'x');
  for (size_t i = 0; i < text.size(); i += 80) text[i] = '\n';
  for (int i = 0; i < 100; ++i) {
    HelloAckMsg ack;
    ack.code = i % 2 == 0 ? kRefusedAsDeclaredFailed : StatusCode::kFailedPrecondition;
    ack.message = text;
    ASSERT_TRUE(ManagerAccess::Of(prefill())
                    .transport()
                    .SendMessage(from_prefill, EncodeMessage(prefill().self(), ack))
                    .ok());
  }
  ASSERT_TRUE(ManagerAccess::Of(prefill())
                  .transport()
                  .SendMessage(from_prefill, std::string(9, '\xff'))
                  .ok());
  ASSERT_TRUE(WaitFor([&] { return decode().Stats().invalid_messages_dropped == before + 1; }));
  EXPECT_TRUE(log.Matching("refused this process's handshake").empty());
  std::optional<PeerSnapshot> seen = PeerAt(ManagerAccess::Of(decode()), prefill().self());
  ASSERT_TRUE(seen.has_value());
  EXPECT_TRUE(seen->ready);
  EXPECT_FALSE(seen->failed);
  EXPECT_EQ(seen->endpoint, decode_ep);
  Request r{.room = 33};
  r.src = {3, 4};
  r.dst = {11, 12};
  ASSERT_NO_FATAL_FAILURE(Start(*cluster_, r, false));
  ASSERT_NO_FATAL_FAILURE(SendChunks(r, {2}));
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(*cluster_, r));
}

// Prefill holds metadata that came before its sender (sglang's decode often
// sends it first) for waiting_timeout. A decode rank that keeps sending it
// for requests this rank never gets grew that store without bound. Past
// max_pending_requests the request fails at once, naming the option and
// the rank, and the held requests still go through when their senders come.
TEST(PendingLimitTest, MetadataBeyondTheLimitFailsItsRequestAndTheHeldOnesGoThrough) {
  ClusterOptions o;
  o.tweak = [](ManagerOptions& m) {
    TolerantLiveness(m);
    m.max_pending_requests = 3;
  };
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  KVManager& decode = *(*c)->decode[0].manager;
  KVManager& prefill = *(*c)->prefill[0].manager;
  std::vector<Request> reqs(4);
  for (int i = 0; i < 4; ++i) {
    Request& r = reqs[i];
    r.room = 10 + i;
    r.src = {1 + i, 20 + i};
    r.dst = {40 + 2 * i, 41 + 2 * i};
    auto rc = KVReceiver::Create(decode, r.room);
    ASSERT_TRUE(rc.ok()) << rc.status().ToString();
    ASSERT_TRUE((*rc)->Init(0).ok());
    ASSERT_TRUE((*rc)->SendMetadata(r.dst, r.dst_aux, r.dst_state).ok());
    r.receivers.push_back(std::move(rc).value());
  }
  // Which request is refused depends on the order its metadata reached
  // prefill: a receiver whose source is not met yet is resolved on the
  // resolver thread and may send after a later one resolved from a known
  // peer. Exactly one is refused once all four arrived.
  auto failed = [&] {
    std::vector<size_t> out;
    for (size_t i = 0; i < reqs.size(); ++i)
      if (reqs[i].receivers[0]->Poll() == KVPoll::kFailed) out.push_back(i);
    return out;
  };
  ASSERT_TRUE(WaitFor([&] { return !failed().empty(); }));
  ASSERT_TRUE(WaitFor([&] { return prefill.Stats().pending_metadata == 3u; }));
  ASSERT_EQ(failed().size(), 1u);
  const size_t refused = failed().front();
  const FailureRecord why = *reqs[refused].receivers[0]->Failure();
  EXPECT_EQ(why.cause, FailureCause::kInvalidRequest);
  EXPECT_TRUE(why.origin.SameRank(prefill.self())) << why.Message();
  EXPECT_NE(why.detail.find("max_pending_requests = 3"), std::string::npos) << why.Message();
  reqs.erase(reqs.begin() + static_cast<std::ptrdiff_t>(refused));
  for (int i = 0; i < 3; ++i) {
    Request& r = reqs[i];
    ASSERT_NE(r.receivers[0]->Poll(), KVPoll::kFailed) << r.receivers[0]->Failure()->Message();
    auto s = KVSender::Create(prefill, r.room);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    r.senders.push_back(std::move(s).value());
    (*c)->prefill[0].pool->Fill(r.room, r.src, r.src_aux, r.src_state);
    ASSERT_TRUE(WaitFor([&] { return r.senders[0]->Poll() == KVPoll::kWaitingForInput; }));
    ASSERT_TRUE(r.senders[0]->Init(r.src.size(), r.src_aux).ok());
    ASSERT_NO_FATAL_FAILURE(SendChunks(r, {2}));
    ASSERT_NO_FATAL_FAILURE(ExpectDelivered(**c, r));
  }
}

// Makes a manager of `role` over a small pool with `set` applied to its
// options: the status of that attempt.
Status CreateWith(Role role, const std::function<void(ManagerOptions&)>& set) {
  PoolOptions po;
  po.num_pages = 8;
  auto pool = KvPool::Create(po);
  if (!pool.ok()) return pool.status();
  ManagerOptions mo;
  mo.role = role;
  mo.args = (*pool)->Args();
  mo.start_bootstrap_server = false;
  set(mo);
  auto fabric = std::make_shared<LoopbackFabric>();
  auto transport = CreateLoopbackTransport(fabric, std::string(RoleName(role)));
  if (!transport.ok()) return transport.status();
  return CreateManager(mo, std::move(transport).value()).status();
}

// What the wire refuses is refused locally too, naming the limit.
TEST(PeerLimitsOptionsTest, ParallelSizeAboveTheWireLimitIsRefused) {
  for (int size : {kMaxParallelSize + 1, 1 << 30}) {
    Status st = CreateWith(Role::kDecode, [&](ManagerOptions& mo) { mo.parallel.tp_size = size; });
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_EQ(st.message(), "tp size " + std::to_string(size) + " exceeds the limit of 1024");
  }
}

// An advertised address peers could not use (it goes into their URLs) is
// refused when the manager is made, not when the first peer tries it.
TEST(PeerLimitsOptionsTest, AnAdvertisedHostThatIsNotAnAddressIsRefused) {
  for (const char* host : {"", "10.0.0.1:80", "evil@10.0.0.1"}) {
    Status st = CreateWith(Role::kPrefill, [&](ManagerOptions& mo) { mo.advertise_host = host; });
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << host << ": " << st.ToString();
    EXPECT_NE(st.message().find("advertise_host '" + std::string(host) + "'"), std::string::npos)
        << st.message();
  }
}

}  // namespace
}  // namespace kvbridge::internal
