// Bad input: every misuse gives a specific code naming the value, fails only
// that request (both sides learn why), and writes nothing.
#include <gtest/gtest.h>

#include "connector/test_cluster.h"

namespace kvbridge::internal {
namespace {

constexpr uint8_t kFiller = 0xAB;

struct Fixture {
  std::unique_ptr<TestCluster> c;
  std::unique_ptr<KVSender> sender;
  std::unique_ptr<KVReceiver> receiver;
  std::vector<int32_t> src{1, 2, 3}, dst{10, 11, 12};
};

// Brings room 1 to prefill WaitingForInput (metadata sent, nothing written).
void Prepare(Fixture& f, bool send_metadata = true) {
  auto c = TestCluster::Create(ClusterOptions{});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  f.c = std::move(c).value();
  f.c->decode[0].pool->Scrub(f.dst, kFiller);
  f.c->prefill[0].pool->Fill(1, f.src, 0, {});
  f.receiver = std::move(KVReceiver::Create(*f.c->decode[0].manager, 1)).value();
  f.sender = std::move(KVSender::Create(*f.c->prefill[0].manager, 1)).value();
  ASSERT_TRUE(f.receiver->Init(0).ok());
  if (!send_metadata) return;
  ASSERT_TRUE(f.receiver->SendMetadata(f.dst, 0, {}).ok());
  ASSERT_TRUE(WaitFor([&] { return f.sender->Poll() == KVPoll::kWaitingForInput; }));
}

void ExpectRejected(const Status& s, StatusCode code, const std::string& needle) {
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_NE(s.message().find(needle), std::string::npos)
      << "'" << s.message() << "' does not name '" << needle << "'";
}

// The sender failed with invalid_request; decode learns it, naming prefill.
void ExpectBothSidesFailed(Fixture& f, FailureCause cause = FailureCause::kInvalidRequest) {
  EXPECT_EQ(f.sender->Poll(), KVPoll::kFailed);
  ASSERT_TRUE(f.sender->Failure().has_value());
  EXPECT_EQ(f.sender->Failure()->cause, cause);
  ASSERT_TRUE(WaitFor([&] { return f.receiver->Poll() == KVPoll::kFailed; }));
  auto r = f.receiver->Failure();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->cause, cause);
  EXPECT_TRUE(r->is_from_another_rank);
  EXPECT_EQ(r->origin.role, Role::kPrefill);
  ASSERT_TRUE(WaitFor([&] { return f.receiver->Quiesced(); }));
  EXPECT_TRUE(f.c->decode[0].pool->PagesHold(f.dst, kFiller)) << "bytes landed";
}

struct SenderCase {
  const char* name;
  std::function<Status(Fixture&)> act;
  StatusCode code;
  const char* needle;
};

class SenderBadInputTest : public ::testing::TestWithParam<SenderCase> {};

TEST_P(SenderBadInputTest, RejectsAndFailsOnlyThatRequest) {
  Fixture f;
  Prepare(f);
  ExpectRejected(GetParam().act(f), GetParam().code, GetParam().needle);
  ExpectBothSidesFailed(f);
}

std::vector<int32_t> Pages(std::initializer_list<int32_t> l) { return l; }

INSTANTIATE_TEST_SUITE_P(
    Cases, SenderBadInputTest,
    ::testing::Values(SenderCase{"page_out_of_range",
                                 [](Fixture& f) {
                                   EXPECT_TRUE(f.sender->Init(3, 0).ok());
                                   return f.sender->Send(Pages({1, 2, 64}));
                                 },
                                 StatusCode::kInvalidArgument, "64"},
                      SenderCase{"negative_page",
                                 [](Fixture& f) {
                                   EXPECT_TRUE(f.sender->Init(3, 0).ok());
                                   return f.sender->Send(Pages({1, -2, 3}));
                                 },
                                 StatusCode::kInvalidArgument, "-2"},
                      SenderCase{"wrong_page_count",
                                 [](Fixture& f) { return f.sender->Init(5, 0); },
                                 StatusCode::kInvalidArgument, "3 destination pages"},
                      SenderCase{"aux_out_of_range",
                                 [](Fixture& f) { return f.sender->Init(3, 64); },
                                 StatusCode::kInvalidArgument, "aux index 64"},
                      SenderCase{"send_before_init",
                                 [](Fixture& f) {
                                   return f.sender->Send(Pages({1, 2, 3}));
                                 },
                                 StatusCode::kFailedPrecondition, "before Init"},
                      SenderCase{"chunk_past_num_pages",
                                 [](Fixture& f) {
                                   EXPECT_TRUE(f.sender->Init(3, 0).ok());
                                   return f.sender->Send(Pages({1, 2, 3, 4}));
                                 },
                                 StatusCode::kInvalidArgument, "exceeds num_pages 3"},
                      SenderCase{"init_twice",
                                 [](Fixture& f) {
                                   EXPECT_TRUE(f.sender->Init(3, 0).ok());
                                   return f.sender->Init(3, 0);
                                 },
                                 StatusCode::kFailedPrecondition, "Init called twice"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(SenderBadInputTest, SendAfterLastChunk) {
  Fixture f;
  Prepare(f);
  ASSERT_TRUE(f.sender->Init(3, 0).ok());
  ASSERT_TRUE(f.sender->Send(f.src).ok());
  ASSERT_TRUE(WaitFor([&] { return f.receiver->Poll() == KVPoll::kSuccess; }));
  ExpectRejected(f.sender->Send(f.src), StatusCode::kFailedPrecondition, "after the last chunk");
}

struct ReceiverCase {
  const char* name;
  std::function<Status(Fixture&)> act;
  StatusCode code;
  const char* needle;
};

class ReceiverBadInputTest : public ::testing::TestWithParam<ReceiverCase> {};

TEST_P(ReceiverBadInputTest, RejectsBeforeAnythingIsSent) {
  Fixture f;
  Prepare(f, /*send_metadata=*/false);
  ExpectRejected(GetParam().act(f), GetParam().code, GetParam().needle);
  EXPECT_EQ(f.receiver->Poll(), KVPoll::kFailed);
  ASSERT_TRUE(f.receiver->Failure().has_value());
  EXPECT_EQ(f.receiver->Failure()->cause, FailureCause::kInvalidRequest);
  EXPECT_FALSE(f.receiver->Failure()->is_from_another_rank);
  EXPECT_TRUE(f.receiver->Quiesced());  // nothing was sent: nothing can land
  // The prefill side never got metadata for the room; it learns why decode
  // gave up (issue 10: a decode-side rejection reaches prefill).
  ASSERT_TRUE(WaitFor([&] { return f.sender->Poll() == KVPoll::kFailed; }));
  ASSERT_TRUE(f.sender->Failure().has_value());
  EXPECT_EQ(f.sender->Failure()->cause, FailureCause::kInvalidRequest);
  EXPECT_EQ(f.sender->Failure()->origin.role, Role::kDecode);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ReceiverBadInputTest,
    ::testing::Values(ReceiverCase{"duplicate_pages",
                                   [](Fixture& f) {
                                     return f.receiver->SendMetadata(Pages({4, 5, 4}), 0, {});
                                   },
                                   StatusCode::kInvalidArgument, "4"},
                      ReceiverCase{"page_out_of_range",
                                   [](Fixture& f) {
                                     return f.receiver->SendMetadata(Pages({4, 99}), 0, {});
                                   },
                                   StatusCode::kInvalidArgument, "99"},
                      ReceiverCase{
                          "aux_out_of_range",
                          [](Fixture& f) { return f.receiver->SendMetadata(Pages({4}), 1000, {}); },
                          StatusCode::kInvalidArgument, "aux index 1000"},
                      ReceiverCase{"state_out_of_range",
                                   [](Fixture& f) {
                                     return f.receiver->SendMetadata(Pages({4}), 0, Pages({77}));
                                   },
                                   StatusCode::kInvalidArgument, "state index 77"},
                      ReceiverCase{"init_twice", [](Fixture& f) { return f.receiver->Init(0); },
                                   StatusCode::kFailedPrecondition, "Init called twice"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(ReceiverBadInputTest, SendMetadataBeforeInit) {
  auto c = TestCluster::Create(ClusterOptions{});
  ASSERT_TRUE(c.ok());
  auto r = std::move(KVReceiver::Create(*(*c)->decode[0].manager, 3)).value();
  ExpectRejected(r->SendMetadata(Pages({1}), 0, {}), StatusCode::kFailedPrecondition,
                 "before Init");
  EXPECT_EQ(r->Poll(), KVPoll::kFailed);
}

TEST(BadInputTest, OtherRequestsAreUntouched) {
  Fixture f;
  Prepare(f);
  // A healthy request next to the bad one.
  auto good_r = std::move(KVReceiver::Create(*f.c->decode[0].manager, 2)).value();
  auto good_s = std::move(KVSender::Create(*f.c->prefill[0].manager, 2)).value();
  std::vector<int32_t> gsrc{20, 21}, gdst{30, 31};
  f.c->prefill[0].pool->Fill(2, gsrc, 1, {});
  ASSERT_TRUE(good_r->Init(0).ok());
  ASSERT_TRUE(good_r->SendMetadata(gdst, 1, {}).ok());
  ASSERT_TRUE(WaitFor([&] { return good_s->Poll() == KVPoll::kWaitingForInput; }));
  ASSERT_TRUE(good_s->Init(2, 1).ok());

  ASSERT_TRUE(f.sender->Init(3, 0).ok());
  EXPECT_FALSE(f.sender->Send(Pages({1, 2, 1000})).ok());
  ExpectBothSidesFailed(f);

  ASSERT_TRUE(good_s->Send(gsrc).ok());
  ASSERT_TRUE(WaitFor([&] { return good_r->Poll() == KVPoll::kSuccess; }));
  EXPECT_EQ(good_s->Poll(), KVPoll::kSuccess);
  EXPECT_EQ(f.c->decode[0].pool->CountCorruptPages(2, gdst), 0u);
}

TEST(BadInputTest, LayoutMismatchFailsAtInitNamingBothValues) {
  ClusterOptions o;
  o.tweak = [](ManagerOptions& m) {
    if (m.role == Role::kDecode) m.args.dtype = "float16";
  };
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto r = std::move(KVReceiver::Create(*(*c)->decode[0].manager, 1)).value();
  // Init looks nothing up itself: the resolver finds the mismatch.
  ASSERT_TRUE(r->Init(0).ok());
  ASSERT_TRUE(WaitFor([&] { return r->Poll() == KVPoll::kFailed; })) << KVPollName(r->Poll());
  ASSERT_TRUE(r->Failure().has_value());
  const std::string detail = r->Failure()->detail;
  EXPECT_NE(detail.find("prefill 'bfloat16', decode 'float16'"), std::string::npos) << detail;
  EXPECT_EQ(r->Failure()->cause, FailureCause::kLayoutMismatch);
  // The record names the incompatible prefill rank in full, as the
  // registry knows it: no "host ?, pid 0".
  const RankId prefill = (*c)->prefill[0].manager->self();
  const RankId origin = r->Failure()->origin;
  EXPECT_TRUE(origin.SameRank(prefill)) << r->Failure()->Message();
  EXPECT_EQ(origin.host, prefill.host) << r->Failure()->Message();
  EXPECT_EQ(origin.pid, prefill.pid) << r->Failure()->Message();
  EXPECT_EQ(origin.incarnation, prefill.incarnation);
}

}  // namespace
}  // namespace kvbridge::internal
