#include "connector/protocol.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "common/wire.h"

namespace kvbridge::internal {
namespace {

RankId Rank(Role role, int tp) {
  RankId r;
  r.role = role;
  r.tp = tp;
  r.pp = 1;
  r.host = "host-a";
  r.boot_id = "0f3c1d2e-5a6b-4c7d-8e9f-0a1b2c3d4e5f";
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

constexpr int32_t kDraftLayerId = 1'000'000;  // sglang's first draft layer id

TEST(ProtocolTest, EveryMessageRoundTrips) {
  RankLayout layout;
  layout.is_mla = true;
  layout.page_size = 16;
  layout.dtype = "bfloat16";
  layout.tp_size = 4;
  layout.tp_rank = 3;  // the sender's tp
  layout.kv = {{0x1000, 4096, 256}};
  layout.aux = {{0x9000, 640, 64}};
  layout.state = {{0xa000, 4096, 64}, {0xb000, 4096, 64}};
  layout.state_sharding = {{16, 1, {4, 4, 8}}, {}};
  layout.kv_layer_ids = {kDraftLayerId};
  std::vector<MessageBody> bodies = {
      HelloMsg{layout, 4, "addr", {"k1"}, {"a"}, {"s0", "s1"}, 0x77, Nonce{1}, Digest{9, 8}},
      HelloAckMsg{StatusCode::kFailedPrecondition, "page size mismatch", "addr2", "shm"},
      MetaMsg{42, 7, 2, true, {1, 5, 9}, 3, {4}, 2},
      NotifyMsg{42, 7, 3, true, 12},
      RoomFailedMsg{42, 7, true, Record()},
      QuiescedMsg{42, 7},
      HeartbeatMsg{99},
      RankFailedMsg{Record()},
      HelloChallengeMsg{0x11, 0x22, Nonce{1, 2, 3}, Digest{4, 5}},
      HelloProofMsg{0x22, Digest{6, 7}, "the Hello as sent"},
  };
  ASSERT_EQ(bodies.size(), std::variant_size_v<MessageBody>);
  for (const MessageBody& body : bodies) {
    RankId from = Rank(Role::kDecode, 3);
    from.instance = "decode-b";
    std::string bytes = EncodeMessage(from, body);
    Result<Message> m = DecodeMessage(bytes);
    ASSERT_TRUE(m.ok()) << "type " << body.index() << ": " << m.status().ToString();
    EXPECT_EQ(m->body.index(), body.index());
    EXPECT_EQ(m->from.ToString(), "decode[decode-b] tp3 pp1 (host host-a, pid 1234)");
    EXPECT_EQ(m->from.incarnation, 0xfeedbeefcafeull);
    EXPECT_EQ(m->from.boot_id, "0f3c1d2e-5a6b-4c7d-8e9f-0a1b2c3d4e5f");
  }
  auto meta =
      std::get<MetaMsg>(DecodeMessage(EncodeMessage(Rank(Role::kDecode, 0), bodies[2]))->body);
  EXPECT_EQ(meta.pages, (std::vector<int32_t>{1, 5, 9}));
  EXPECT_EQ(meta.aux_index, 3);
  EXPECT_EQ(meta.prefix_pages, 2);
  EXPECT_TRUE(meta.dummy);
  auto ack =
      std::get<HelloAckMsg>(DecodeMessage(EncodeMessage(Rank(Role::kDecode, 3), bodies[1]))->body);
  EXPECT_EQ(ack.address, "addr2");
  EXPECT_EQ(ack.path, "shm");
  auto hello =
      std::get<HelloMsg>(DecodeMessage(EncodeMessage(Rank(Role::kDecode, 3), bodies[0]))->body);
  EXPECT_TRUE(hello.layout.is_mla);
  EXPECT_EQ(hello.layout.state_sharding, layout.state_sharding);
  EXPECT_EQ(hello.layout.kv_layer_ids, layout.kv_layer_ids);
  EXPECT_EQ(hello.layout.kv[0].item_len, 256u);
  EXPECT_EQ(hello.kv_keys, (std::vector<std::string>{"k1"}));
  EXPECT_EQ(hello.tp_size, 4);
  EXPECT_EQ(hello.layout.tp_rank, 3);
  EXPECT_EQ(hello.session, 0x77u);
  EXPECT_EQ(hello.nonce, (Nonce{1}));
  EXPECT_EQ(hello.address_tag, (Digest{9, 8}));
  auto challenge = std::get<HelloChallengeMsg>(
      DecodeMessage(EncodeMessage(Rank(Role::kPrefill, 0), bodies[8]))->body);
  EXPECT_EQ(challenge.decode_session, 0x11u);
  EXPECT_EQ(challenge.session, 0x22u);
  EXPECT_EQ(challenge.nonce, (Nonce{1, 2, 3}));
  EXPECT_EQ(challenge.proof, (Digest{4, 5}));
  auto proof = std::get<HelloProofMsg>(
      DecodeMessage(EncodeMessage(Rank(Role::kDecode, 0), bodies[9]))->body);
  EXPECT_EQ(proof.session, 0x22u);
  EXPECT_EQ(proof.proof, (Digest{6, 7}));
  EXPECT_EQ(proof.hello, "the Hello as sent");
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

// Replaces the one little-endian occurrence of `marker` in `bytes`.
std::string Patch(std::string bytes, int64_t marker, int64_t value) {
  std::string m(reinterpret_cast<const char*>(&marker), 8);
  size_t at = bytes.find(m);
  EXPECT_NE(at, std::string::npos);
  EXPECT_EQ(bytes.find(m, at + 1), std::string::npos) << "marker not unique";
  if (at != std::string::npos) std::memcpy(&bytes[at], &value, 8);
  return bytes;
}

void ExpectRejected(const std::string& bytes, const std::string& why) {
  Result<Message> m = DecodeMessage(bytes);
  ASSERT_FALSE(m.ok()) << "accepted; wanted: " << why;
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find(why), std::string::npos)
      << "'" << m.status().message() << "' lacks '" << why << "'";
}

// Finding 7: decode_tp_size drove ComputeFlows unchecked (OOM at 2^30).
TEST(ProtocolLimitsTest, MetaTpSizeOutsideTheRankLimitIsRejected) {
  MetaMsg meta{42, 7, 1 << 30, false, {1}, 0, {}, 0};
  ExpectRejected(EncodeMessage(Rank(Role::kDecode, 0), meta),
                 "(Meta) of 161 bytes: decode_tp_size 1073741824 out of range [1, 1024]");
  meta.decode_tp_size = 0;
  ExpectRejected(EncodeMessage(Rank(Role::kDecode, 0), meta), "decode_tp_size 0 out of range");
  meta.decode_tp_size = kMaxParallelSize;
  EXPECT_TRUE(DecodeMessage(EncodeMessage(Rank(Role::kDecode, 0), meta)).ok());
}

// A boot id says which machine a rank runs on (common/host_identity.h); a
// hostile one is bounded like the host name.
TEST(ProtocolLimitsTest, BootIdIsBounded) {
  RankId from = Rank(Role::kDecode, 0);
  from.boot_id.assign(256, 'b');
  EXPECT_TRUE(DecodeMessage(EncodeMessage(from, HeartbeatMsg{})).ok());
  from.boot_id.assign(257, 'b');
  ExpectRejected(EncodeMessage(from, HeartbeatMsg{}), "rank boot id of 257 bytes");
}

// A rank of a build from before the boot id (another message format) is
// told apart from garbage, with what to do.
TEST(ProtocolLimitsTest, AMessageOfTheOlderFormatSaysUpgradeEveryRank) {
  std::string bytes = EncodeMessage(Rank(Role::kDecode, 0), HeartbeatMsg{1});
  const uint32_t before_boot_id = 0x4b56424d;
  std::memcpy(bytes.data(), &before_boot_id, sizeof(before_boot_id));
  ExpectRejected(bytes, "older message format (no boot id in a rank): upgrade every rank");
  const uint32_t before_stateless_challenge = 0x4b56424e;  // "KVBN"
  std::memcpy(bytes.data(), &before_stateless_challenge, sizeof(before_stateless_challenge));
  ExpectRejected(bytes,
                 "older message format (a handshake whose proof does not carry its Hello): "
                 "upgrade every rank");
  const uint32_t before_address_tag = 0x4b56424f;  // "KVBO"
  std::memcpy(bytes.data(), &before_address_tag, sizeof(before_address_tag));
  ExpectRejected(bytes,
                 "older message format (a Hello whose address is not tagged): upgrade every rank");
  const uint32_t other = 0x12345678;
  std::memcpy(bytes.data(), &other, sizeof(other));
  ExpectRejected(bytes, "bad magic 0x12345678");
}

// Finding 7: GetInt truncated int64 to int, so 2^32 + 1 arrived as 1.
TEST(ProtocolLimitsTest, Int64OutsideIntRangeIsRejectedNotTruncated) {
  const int64_t marker = 0x5a5a5a5a;  // the sender's pid
  RankId from = Rank(Role::kDecode, 0);
  from.pid = marker;
  std::string bytes = EncodeMessage(from, HeartbeatMsg{1});
  ExpectRejected(Patch(bytes, marker, (int64_t{1} << 32) + 1234),
                 "rank pid 4294968530 out of range [0, 2147483647]");
  ExpectRejected(Patch(bytes, marker, -1), "rank pid -1 out of range");
  from.pid = 0;
  from.tp = static_cast<int>(marker);  // tp: past the rank limit, and out of int range
  bytes = EncodeMessage(from, HeartbeatMsg{1});
  ExpectRejected(bytes, "rank tp 1515870810 out of range [0, 1023]");
  ExpectRejected(Patch(bytes, marker, (int64_t{1} << 32) + 1), "rank tp 4294967297 out of range");
}

// Finding 7: a peer timestamp of INT64_MAX overflowed FromMicros (UBSan).
TEST(ProtocolLimitsTest, TimestampPastTheClockIsRejectedWithoutOverflow) {
  FailureRecord f = Record();
  const int64_t marker = 1234567890123456;
  f.detected_at = std::chrono::system_clock::time_point(std::chrono::microseconds(marker));
  std::string bytes = EncodeMessage(Rank(Role::kPrefill, 0), RankFailedMsg{f});
  for (int64_t bad : {INT64_MAX, INT64_MIN, int64_t{-1}, kMaxTimestampMicros + 1}) {
    ExpectRejected(Patch(bytes, marker, bad),
                   "record detected_at " + std::to_string(bad) + " out of range [0, ");
  }
  Result<Message> edge = DecodeMessage(Patch(bytes, marker, kMaxTimestampMicros));
  ASSERT_TRUE(edge.ok()) << edge.status().ToString();
  const FailureRecord& r = std::get<RankFailedMsg>(edge->body).record;
  EXPECT_EQ(std::chrono::duration_cast<std::chrono::microseconds>(r.detected_at.time_since_epoch())
                .count(),
            kMaxTimestampMicros);
  EXPECT_NE(r.Message().find("last sign of life"), std::string::npos);  // no overflow either
  // The same check guards the record blob of the bootstrap registry.
  std::string blob = EncodeFailureRecord(f);
  blob.resize(blob.size() - 4);  // the CRC, recomputed below
  std::string patched = Patch(blob, marker, INT64_MAX);
  WireWriter crc;
  crc.U32(Crc32(patched));
  Result<FailureRecord> back = DecodeFailureRecord(patched + crc.Finish());
  EXPECT_EQ(back.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(back.status().message().find("record detected_at 9223372036854775807 out of range"),
            std::string::npos)
      << back.status().ToString();
}

HelloMsg GoodHello() {
  HelloMsg h;
  h.layout.page_size = 16;
  h.layout.dtype = "bfloat16";
  h.layout.kv = {{0x1000, 4096, 256}, {0x2000, 4096, 256}};
  h.tp_size = 1;
  h.address = "addr";
  h.kv_keys = {"k0", "k1"};
  return h;
}

// Every count and length a peer declares has a limit the error names.
TEST(ProtocolLimitsTest, EveryCountAndLengthIsBounded) {
  const RankId from = Rank(Role::kDecode, 0);
  ASSERT_TRUE(DecodeMessage(EncodeMessage(from, GoodHello())).ok());
  struct Case {
    const char* why;
    std::function<void(HelloMsg&)> edit;
  };
  std::vector<Case> hello_cases = {
      {"dtype of 257 bytes exceeds the limit of 256",
       [](HelloMsg& h) { h.layout.dtype.assign(257, 'x'); }},
      {"address of 65537 bytes exceeds the limit of 65536",
       [](HelloMsg& h) { h.address.assign(65537, 'a'); }},
      {"kv keys of 65537 bytes exceeds the limit",
       [](HelloMsg& h) { h.kv_keys[1].assign(65537, 'k'); }},
      {"3 kv keys for 2 buffers", [](HelloMsg& h) { h.kv_keys.push_back("k2"); }},
      {"tp_size 2 disagrees with the layout's tp_size 1", [](HelloMsg& h) { h.tp_size = 2; }},
      {"tp_size 1025 out of range [1, 1024]",
       [](HelloMsg& h) { h.tp_size = h.layout.tp_size = 1025; }},
      {"layout tp_rank 1 out of range [0, 1)", [](HelloMsg& h) { h.layout.tp_rank = 1; }},
      {"kv buffer count 4097 exceeds the limit of 4096",
       [](HelloMsg& h) {
         h.layout.kv.assign(4097, {0x1000, 4096, 256});
       }},
      {"kv[1] of 4096 bytes at 0xfffffffffffff800",
       [](HelloMsg& h) { h.layout.kv[1].addr = UINT64_MAX - 2047; }},
      {"kv[0] of 281474976710657 bytes",
       [](HelloMsg& h) { h.layout.kv[0].length = kMaxBufferBytes + 1; }},
      {"kv[0] of 4096 bytes at 0x1000, items of 8192",
       [](HelloMsg& h) { h.layout.kv[0].item_len = 8192; }},
  };
  for (const Case& c : hello_cases) {
    HelloMsg h = GoodHello();
    c.edit(h);
    ExpectRejected(EncodeMessage(from, h), c.why);
  }
  HelloMsg other_rank = GoodHello();
  other_rank.layout.tp_size = other_rank.tp_size = 4;
  other_rank.layout.tp_rank = 2;
  ExpectRejected(EncodeMessage(from, other_rank), "layout tp_rank 2 is not the sender's tp 0");
  RankId tp2 = from;
  tp2.tp = 2;
  EXPECT_TRUE(DecodeMessage(EncodeMessage(tp2, other_rank)).ok());
  RankId long_host = from;
  long_host.host.assign(257, 'h');
  ExpectRejected(EncodeMessage(long_host, HeartbeatMsg{}), "rank host of 257 bytes");
  RankId long_instance = from;
  long_instance.instance.assign(257, 'i');
  ExpectRejected(EncodeMessage(long_instance, HeartbeatMsg{}), "rank instance of 257 bytes");

  MetaMsg meta{1, 2, 1, false, {}, 0, {}, 0};
  meta.aux_index = -2;
  ExpectRejected(EncodeMessage(from, meta), "aux_index -2 out of range [-1, 2147483647]");
  meta.aux_index = 0;
  meta.prefix_pages = -1;
  ExpectRejected(EncodeMessage(from, meta), "prefix_pages -1 out of range");
  meta.prefix_pages = int64_t{1} << 40;
  ExpectRejected(EncodeMessage(from, meta), "prefix_pages 1099511627776 out of range");
  meta.prefix_pages = 0;
  // A count past the limit is refused before the pages it announces are read.
  WireWriter w;
  w.U32(kMaxPagesPerMessage + 1);
  std::string bytes = EncodeMessage(from, meta);
  const size_t count_at = bytes.size() - 8 - 4 - 8 - 4;  // prefix, state count, aux, pages count
  bytes.replace(count_at, 4, w.Finish());
  ExpectRejected(bytes, "page count 16777217 exceeds the limit of 16777216");

  HelloAckMsg ack{StatusCode::kOk, std::string(kMaxTextBytes + 1, 'm'), "addr"};
  ExpectRejected(EncodeMessage(from, ack), "message of 16385 bytes exceeds the limit of 16384");
  std::string code = EncodeMessage(from, HelloAckMsg{StatusCode::kOk, "", ""});
  code[code.size() - 16] = 16;  // the status code, before three empty strings
  ExpectRejected(code, "status code 16 out of range [0, 15]");
  ack = HelloAckMsg{StatusCode::kOk, "", "addr", std::string(kMaxNameBytes + 1, 'p')};
  ExpectRejected(EncodeMessage(from, ack), "path of 257 bytes exceeds the limit of 256");

  FailureRecord f = Record();
  f.detail.assign(kMaxTextBytes + 1, 'd');
  ExpectRejected(EncodeMessage(from, RankFailedMsg{f}), "record detail of 16385 bytes");
  f = Record();
  f.hint.assign(kMaxTextBytes + 1, 'h');
  ExpectRejected(EncodeMessage(from, RoomFailedMsg{1, 2, true, f}), "record hint of 16385 bytes");
}

// A Hello's state sharding: one entry per state buffer, bounded sub-blocks.
TEST(ProtocolLimitsTest, StateShardingInAHelloIsBounded) {
  const RankId from = Rank(Role::kDecode, 0);
  HelloMsg h = GoodHello();
  h.layout.state_sharding = {{4, 1, {}}};
  ExpectRejected(EncodeMessage(from, h),
                 "state sharding for 1 buffers, the layout has 0 state buffers");
  h.layout.state = {{0x9000, 4096, 64}};
  h.state_keys = {"s0"};
  h.layout.state_sharding = {{4, 1, std::vector<uint32_t>(kMaxStateGroups, 2)}};
  EXPECT_TRUE(DecodeMessage(EncodeMessage(from, h)).ok());
  h.layout.state_sharding[0].groups.push_back(2);
  ExpectRejected(EncodeMessage(from, h), "state[0] sub-block count 65 exceeds the limit of 64");
}

// A Hello's kv layer ids: none or one per kv buffer, each a non-negative
// int32 (they pick which decode buffer a prefill buffer is written into).
TEST(ProtocolLimitsTest, LayerIdsInAHelloAreOnePerKvBufferAndInRange) {
  const RankId from = Rank(Role::kDecode, 0);
  HelloMsg h = GoodHello();
  h.layout.kv_layer_ids = {7};
  ExpectRejected(EncodeMessage(from, h), "1 kv layer ids, the layout has 2 kv buffers");
  h.layout.kv_layer_ids = {7, INT32_MAX};
  auto m = DecodeMessage(EncodeMessage(from, h));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(std::get<HelloMsg>(m->body).layout.kv_layer_ids, h.layout.kv_layer_ids);
  // The ids are two u32 (host order, as the codec writes them); make the
  // second 0x80000000, then cut the message inside it.
  std::string bytes = EncodeMessage(from, h);
  const uint32_t ids[2] = {7, static_cast<uint32_t>(INT32_MAX)};
  const size_t at = bytes.find(std::string(reinterpret_cast<const char*>(ids), sizeof(ids)));
  ASSERT_NE(at, std::string::npos);
  const uint32_t too_big = 0x80000000u;
  bytes.replace(at + 4, 4, reinterpret_cast<const char*>(&too_big), 4);
  ExpectRejected(bytes, "kv layer id [1] is 2147483648, past 2147483647");
  ExpectRejected(bytes.substr(0, at + 6), "kv layer id count 2 cannot fit in the 6 bytes left");
}

// A good Hello whose layout holds two state buffers of types 0 and 1.
HelloMsg HelloWithTwoStateTypes() {
  HelloMsg h = GoodHello();
  h.layout.state = {{0x100000, 64, 8}, {0x200000, 64, 8}};
  h.state_keys = {"s0", "s1"};
  h.layout.state_types = {0, 1};
  return h;
}

TEST(ProtocolLimitsTest, StateTypesAndLayerIdsInAHelloAreOnePerStateBufferAndInRange) {
  const RankId from = Rank(Role::kDecode, 0);
  HelloMsg h = HelloWithTwoStateTypes();
  h.layout.state_layer_ids = {-1, INT32_MAX};
  auto m = DecodeMessage(EncodeMessage(from, h));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(std::get<HelloMsg>(m->body).layout.state_types, h.layout.state_types);
  EXPECT_EQ(std::get<HelloMsg>(m->body).layout.state_layer_ids, h.layout.state_layer_ids);
  h.layout.state_layer_ids = {3};
  ExpectRejected(EncodeMessage(from, h), "1 state layer ids, the layout has 2 state buffers");
  h.layout.state_layer_ids = {};
  h.layout.state_types = {0, 2};
  ExpectRejected(EncodeMessage(from, h), "state type [1] 2 out of range [0, 1]");
  // Ids travel as id + 1 (u32): -1 is 0; past INT32_MAX + 1 is refused.
  h.layout.state_types = {0, 1};
  h.layout.state_layer_ids = {-1, 77};
  std::string bytes = EncodeMessage(from, h);
  const uint32_t ids[2] = {0, 78};
  const size_t at = bytes.find(std::string(reinterpret_cast<const char*>(ids), sizeof(ids)));
  ASSERT_NE(at, std::string::npos);
  const uint32_t too_big = 0x80000001u;
  bytes.replace(at + 4, 4, reinterpret_cast<const char*>(&too_big), 4);
  ExpectRejected(bytes, "state layer id [1] + 1 2147483649 out of range [0, 2147483648]");
}

// State type names end the layout: at most one per state buffer, each at
// most 64 bytes (CheckLayout then wants one per type, printable).
TEST(ProtocolLimitsTest, StateTypeNamesInAHelloAreBoundedInCountAndLength) {
  const RankId from = Rank(Role::kDecode, 0);
  HelloMsg h = HelloWithTwoStateTypes();
  h.layout.state_type_names = {"MAMBA", std::string(64, 'S')};
  auto m = DecodeMessage(EncodeMessage(from, h));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(std::get<HelloMsg>(m->body).layout.state_type_names, h.layout.state_type_names);
  h.layout.state_type_names = {"A", "B", "C"};
  ExpectRejected(EncodeMessage(from, h), "3 state type names, the layout has 2 state buffers");
  h.layout.state_type_names = {"MAMBA", std::string(65, 'S')};
  ExpectRejected(EncodeMessage(from, h), "state type name [1]");
  // A count past what the rest of the message can hold is refused before
  // anything is allocated for it.
  h.layout.state_type_names = {"MAMBA", "SWA"};
  std::string bytes = EncodeMessage(from, h);
  // The count (2), then the first name as its length (5) and bytes.
  const uint32_t head[2] = {2, 5};
  const size_t at =
      bytes.find(std::string(reinterpret_cast<const char*>(head), sizeof(head)) + "MAMBA");
  ASSERT_NE(at, std::string::npos);
  const uint32_t huge = 0xFFFFFFF0u;
  bytes.replace(at, 4, reinterpret_cast<const char*>(&huge), 4);
  ExpectRejected(bytes, "state type name count");
}

// Decode context parallelism ends the layout: dcp_size in [1, the rank
// limit], dcp_rank below it (CheckLayout then wants rank < size, MLA).
// The pipeline size a Hello gives (which prefill stage writes the aux row
// and unpaired state: LastStageRead) round-trips and is bounded.
TEST(ProtocolLimitsTest, PpSizeInAHelloRoundTripsAndIsBounded) {
  const RankId from = Rank(Role::kDecode, 0);
  HelloMsg h = HelloWithTwoStateTypes();
  h.layout.pp_size = 4;
  auto m = DecodeMessage(EncodeMessage(from, h));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(std::get<HelloMsg>(m->body).layout.pp_size, 4);
  for (int bad : {0, -1, kMaxParallelSize + 1}) {
    h.layout.pp_size = bad;
    ExpectRejected(EncodeMessage(from, h), "layout pp_size");
  }
}

TEST(ProtocolLimitsTest, DcpSizeAndRankInAHelloRoundTripAndAreBounded) {
  const RankId from = Rank(Role::kDecode, 0);
  HelloMsg h = HelloWithTwoStateTypes();
  h.layout.dcp_size = 4;
  h.layout.dcp_rank = 3;
  auto m = DecodeMessage(EncodeMessage(from, h));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(std::get<HelloMsg>(m->body).layout.dcp_size, 4);
  EXPECT_EQ(std::get<HelloMsg>(m->body).layout.dcp_rank, 3);
  h.layout.dcp_size = 0;
  ExpectRejected(EncodeMessage(from, h), "dcp_size");
  h.layout.dcp_size = 2;
  h.layout.dcp_rank = -1;
  ExpectRejected(EncodeMessage(from, h), "dcp_rank");
  // Then prefill's cp size and whether every cp rank sends: a flag is 0 or 1.
  h.layout.dcp_rank = 0;
  h.layout.cp_size = 3;
  h.layout.all_cp_ranks = true;
  m = DecodeMessage(EncodeMessage(from, h));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(std::get<HelloMsg>(m->body).layout.cp_size, 3);
  EXPECT_TRUE(std::get<HelloMsg>(m->body).layout.all_cp_ranks);
  std::string bytes = EncodeMessage(from, h);
  h.layout.all_cp_ranks = false;
  const std::string off = EncodeMessage(from, h);
  ASSERT_EQ(bytes.size(), off.size());
  const auto flag = std::mismatch(bytes.begin(), bytes.end(), off.begin()).first - bytes.begin();
  ASSERT_LT(static_cast<size_t>(flag), bytes.size());
  bytes[flag] = 2;
  ExpectRejected(bytes, "all_cp_ranks is 2");
}

// The draft entry count (sglang's num_draft_entries) travels last in a
// Hello's layout, bounded by the layout's own kv buffers.
TEST(ProtocolLimitsTest, DraftEntryCountInAHelloRoundTripsAndIsBoundedByTheKvBuffers) {
  const RankId from = Rank(Role::kDecode, 0);
  HelloMsg h = HelloWithTwoStateTypes();
  ASSERT_GE(h.layout.kv.size(), 1u);
  h.layout.num_draft_entries = static_cast<int>(h.layout.kv.size());
  auto m = DecodeMessage(EncodeMessage(from, h));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(std::get<HelloMsg>(m->body).layout.num_draft_entries, h.layout.num_draft_entries);
  h.layout.num_draft_entries = static_cast<int>(h.layout.kv.size()) + 1;
  ExpectRejected(EncodeMessage(from, h), "num_draft_entries");
  h.layout.num_draft_entries = -1;
  ExpectRejected(EncodeMessage(from, h), "num_draft_entries");
}

// A HelloAck from before the path field (it ended after the address) is
// refused naming the missing field: decoded as "no path", it re-encoded to
// 4 bytes more than were received (the control_message fuzz target's fixed
// point), and a rank would have guessed the path its peer took.
TEST(ProtocolLimitsTest, HelloAckWithoutItsPathIsRejectedNamingIt) {
  const RankId from = Rank(Role::kPrefill, 0);
  const HelloAckMsg ack{StatusCode::kOk, "layout accepted", "addr", "shm"};
  const std::string full = EncodeMessage(from, ack);
  Result<Message> whole = DecodeMessage(full);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(std::get<HelloAckMsg>(whole->body).path, "shm");
  // Without the path's length and bytes: what an older rank sent.
  const std::string old = full.substr(0, full.size() - 4 - ack.path.size());
  ExpectRejected(old, "(HelloAck) of " + std::to_string(old.size()) + " bytes");
  ExpectRejected(old, "path missing: input ends at byte " + std::to_string(old.size()));
  // An empty path is a path: it has its length field and decodes.
  Result<Message> empty = DecodeMessage(EncodeMessage(from, HelloAckMsg{StatusCode::kOk, "", "a"}));
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ(std::get<HelloAckMsg>(empty->body).path, "");
}

TEST(ProtocolLimitsTest, ErrorNamesTypeAndTruncation) {
  std::string bytes = EncodeMessage(Rank(Role::kPrefill, 0), QuiescedMsg{1, 2});
  ExpectRejected(bytes.substr(0, bytes.size() - 1), "(Quiesced) of");
  ExpectRejected(bytes.substr(0, bytes.size() - 1), "truncated at byte");
  ExpectRejected(bytes + "xy", "2 bytes after the end");
  bytes[4] = 50;
  ExpectRejected(bytes, "(unknown)");
  ExpectRejected(bytes, "unknown message type 50");
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
