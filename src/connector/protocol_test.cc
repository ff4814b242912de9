#include "connector/protocol.h"

#include <gtest/gtest.h>

namespace kvbridge::internal {
namespace {

RankId Rank(Role role, int tp) {
  RankId r;
  r.role = role;
  r.tp = tp;
  r.pp = 1;
  r.host = "host-a";
  r.pid = 1234;
  r.incarnation = 0xfeedbeefcafeull;
  return r;
}

FailureRecord Record() {
  FailureRecord f;
  f.room = 42;
  f.generation = 7;
  f.origin = Rank(Role::kPrefill, 1);
  f.cause = FailureCause::kLocalError;
  f.detail = "CUDA out of memory";
  f.phase = Phase::kTransferring;
  f.detected_by = Rank(Role::kDecode, 0);
  f.mechanism = "peer report";
  f.detected_at =
      std::chrono::system_clock::time_point(std::chrono::microseconds(1700000000123456));
  f.last_sign_of_life = f.detected_at - std::chrono::milliseconds(400);
  f.hint = "fix it";
  f.is_from_another_rank = true;
  return f;
}

void ExpectSameRecord(const FailureRecord& a, const FailureRecord& b) {
  EXPECT_EQ(a.room, b.room);
  EXPECT_EQ(a.generation, b.generation);
  EXPECT_EQ(a.origin.ToString(), b.origin.ToString());
  EXPECT_EQ(a.origin.incarnation, b.origin.incarnation);
  EXPECT_EQ(a.cause, b.cause);
  EXPECT_EQ(a.detail, b.detail);
  EXPECT_EQ(a.phase, b.phase);
  EXPECT_EQ(a.detected_by.ToString(), b.detected_by.ToString());
  EXPECT_EQ(a.detected_by.instance, b.detected_by.instance);
  EXPECT_EQ(a.mechanism, b.mechanism);
  EXPECT_EQ(a.detected_at, b.detected_at);
  EXPECT_EQ(a.last_sign_of_life, b.last_sign_of_life);
  EXPECT_EQ(a.hint, b.hint);
  EXPECT_EQ(a.is_from_another_rank, b.is_from_another_rank);
}

TEST(ProtocolTest, EveryMessageRoundTrips) {
  RankLayout layout;
  layout.is_mla = true;
  layout.page_size = 16;
  layout.dtype = "bfloat16";
  layout.kv = {{0x1000, 4096, 256}};
  layout.aux = {{0x9000, 640, 64}};
  std::vector<MessageBody> bodies = {
      HelloMsg{layout, 2, "addr", {"k1", "k2"}, {"a"}, {}},
      HelloAckMsg{StatusCode::kFailedPrecondition, "page size mismatch", "addr2"},
      MetaMsg{42, 7, 2, true, {1, 5, 9}, 3, {4}, 2},
      NotifyMsg{42, 7, 3, true, 12},
      RoomFailedMsg{42, 7, true, Record()},
      QuiescedMsg{42, 7},
      HeartbeatMsg{99},
      RankFailedMsg{Record()},
  };
  for (const MessageBody& body : bodies) {
    RankId from = Rank(Role::kDecode, 3);
    from.instance = "decode-b";
    std::string bytes = EncodeMessage(from, body);
    Result<Message> m = DecodeMessage(bytes);
    ASSERT_TRUE(m.ok()) << "type " << body.index() << ": " << m.status().ToString();
    EXPECT_EQ(m->body.index(), body.index());
    EXPECT_EQ(m->from.ToString(), "decode[decode-b] tp3 pp1 (host host-a, pid 1234)");
    EXPECT_EQ(m->from.incarnation, 0xfeedbeefcafeull);
  }
  auto meta =
      std::get<MetaMsg>(DecodeMessage(EncodeMessage(Rank(Role::kDecode, 0), bodies[2]))->body);
  EXPECT_EQ(meta.pages, (std::vector<int32_t>{1, 5, 9}));
  EXPECT_EQ(meta.aux_index, 3);
  EXPECT_EQ(meta.prefix_pages, 2);
  EXPECT_TRUE(meta.dummy);
  auto hello =
      std::get<HelloMsg>(DecodeMessage(EncodeMessage(Rank(Role::kDecode, 0), bodies[0]))->body);
  EXPECT_TRUE(hello.layout.is_mla);
  EXPECT_EQ(hello.layout.kv[0].item_len, 256u);
  EXPECT_EQ(hello.kv_keys, (std::vector<std::string>{"k1", "k2"}));
  auto failed = std::get<RoomFailedMsg>(
      DecodeMessage(EncodeMessage(Rank(Role::kDecode, 0), bodies[4]))->body);
  EXPECT_TRUE(failed.quiesced);
  ExpectSameRecord(failed.record, Record());
}

TEST(ProtocolTest, RecordNamingTheBootstrapServerRoundTrips) {
  FailureRecord f = Record();
  f.origin = RankId{};
  f.origin.role = Role::kBootstrap;
  f.origin.host = "127.0.0.1:8998";
  f.cause = FailureCause::kRegistryLost;
  auto m = DecodeMessage(EncodeMessage(Rank(Role::kPrefill, 0), RoomFailedMsg{1, 2, true, f}));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(std::get<RoomFailedMsg>(m->body).record.origin.role, Role::kBootstrap);
}

TEST(ProtocolTest, TruncatedOrGarbledMessagesAreRejected) {
  std::string bytes = EncodeMessage(Rank(Role::kPrefill, 0), NotifyMsg{1, 2, 3, false, 4});
  for (size_t n = 0; n < bytes.size(); ++n) {
    Result<Message> m = DecodeMessage(std::string_view(bytes).substr(0, n));
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << "length " << n;
  }
  std::string bad = bytes;
  bad[0] ^= 1;  // magic
  EXPECT_FALSE(DecodeMessage(bad).ok());
  bad = bytes;
  bad[4] = 50;  // type
  EXPECT_FALSE(DecodeMessage(bad).ok());
  EXPECT_FALSE(DecodeMessage(bytes + "x").ok());  // trailing bytes
}

TEST(ProtocolTest, FailureRecordBlobHasChecksum) {
  std::string blob = EncodeFailureRecord(Record());
  auto back = DecodeFailureRecord(blob);
  ASSERT_TRUE(back.ok());
  ExpectSameRecord(*back, Record());
  blob[10] ^= 0x40;
  EXPECT_EQ(DecodeFailureRecord(blob).status().code(), StatusCode::kInvalidArgument);
}

TEST(FailureRecordTest, MessageNamesOriginCausePhaseDetectorAndHint) {
  FailureRecord f = Record();
  f.cause = FailureCause::kPeerExited;
  f.detail = "SIGKILL";
  f.mechanism = "transport error";
  f.hint = "";
  std::string m = f.Message();
  for (const char* needle :
       {"room 42", "prefill tp1 pp1 (host host-a, pid 1234)", "exited", "SIGKILL", "0.4 s",
        "during transferring", "decode tp0 pp1", "via transport error", "dmesg"}) {
    EXPECT_NE(m.find(needle), std::string::npos) << "'" << m << "' lacks '" << needle << "'";
  }
  EXPECT_EQ(f.ToStatus().code(), StatusCode::kUnavailable);
}

TEST(FailureRecordTest, EveryCauseHasNameHintAndCode) {
  for (FailureCause c : AllFailureCauses()) {
    FailureCause parsed;
    ASSERT_TRUE(ParseFailureCause(FailureCauseName(c), &parsed)) << FailureCauseName(c);
    EXPECT_EQ(parsed, c);
    EXPECT_FALSE(FailureHint(c).empty());
    EXPECT_NE(FailureCauseCode(c), StatusCode::kOk);
  }
  FailureCause dummy;
  EXPECT_FALSE(ParseFailureCause("no_such_cause", &dummy));
}

}  // namespace
}  // namespace kvbridge::internal
