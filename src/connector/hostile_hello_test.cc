// A Hello's address reaches the transport before anything in the Hello is
// proven: prefill connects back to it to send its challenge. UCX's parser of
// a worker address trusts its input, so one Hello from anyone who reached a
// prefill rank, naming a malformed address (the blob's CRC is no secret),
// aborted that rank inside ucp_ep_create ("address.c: Assertion
// `*addr_version == UCP_OBJECT_VERSION_V2' failed"). Prefill now connects
// back only to an address a holder of the deployment's secret tagged
// (HandshakeAuth::TagAddress).
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "connector/connector_test_util.h"
#include "connector/manager_impl.h"
#include "connector/peer_auth.h"
#include "connector/protocol.h"
#include "connector/record_tag.h"
#include "connector/sglang_standin.h"
#include "control/auth.h"
#include "control/bootstrap_client.h"
#include "control/http_server.h"
#include "control/rank_endpoint.h"
#include "control/registry_test_util.h"
#include "transport/ucx/ucx_blobs.h"
#include "transport/ucx/ucx_test_util.h"

namespace kvbridge::internal {
namespace {

// One request through the pair, checked byte by byte.
void Deliver(TestCluster& c, uint64_t room) {
  Request r{.room = room, .src = {1, 2, 3}, .dst = {7, 8, 9}};
  Start(c, r, false);
  SendChunks(r, {2, 1});
  ExpectDelivered(c, r);
}

// CRC-valid address blobs of this host whose UCX worker address is not one:
// cut short, its first byte (the address header) changed, or noise.
std::vector<std::string> MalformedAddresses(const std::string& genuine) {
  const ucx::AddressBlob real = ucx::DecodeAddress(genuine).value();
  std::vector<std::string> worker_addresses = {
      real.worker_address.substr(0, 1), real.worker_address.substr(0, 9),
      real.worker_address.substr(0, real.worker_address.size() / 2)};
  for (uint8_t flip : {0x08, 0xf0, 0xff}) {
    std::string w = real.worker_address;
    w[0] = static_cast<char>(w[0] ^ flip);
    worker_addresses.push_back(w);
  }
  worker_addresses.push_back(std::string(64, '\xa5'));
  std::vector<std::string> out;
  for (const std::string& w : worker_addresses) {
    ucx::AddressBlob b = real;
    b.worker_address = w;
    b.network_address.clear();
    out.push_back(ucx::EncodeAddress(b));
  }
  return out;
}

// A prefill/decode pair over UCX (TCP), registered with kvbridge's
// bootstrap server or, with `sglang_server`, with a stand-in of sglang's.
ClusterOptions OverUcx(bool sglang_server) {
  ClusterOptions o;
  o.sglang_server = sglang_server;
  o.tweak = TolerantLiveness;
  o.wrap = [](std::unique_ptr<Transport>, Role r, int) -> std::unique_ptr<Transport> {
    return testing::MakeUcxForTest(
        testing::TcpTestOptions(r == Role::kPrefill ? "prefill" : "decode", false));
  };
  return o;
}

TEST(HostileHelloTest, AMalformedAddressNotTaggedUnderTheSecretReachesNoUcxParser) {
  auto c = TestCluster::Create(OverUcx(/*sglang_server=*/false));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  KVManager& prefill = *(*c)->prefill[0].manager;
  const ManagerImpl& decode = ManagerAccess::Of(*(*c)->decode[0].manager);
  Deliver(**c, 1);

  std::unique_ptr<Transport> intruder =
      testing::MakeUcxForTest(testing::TcpTestOptions("intruder", false));
  ASSERT_NE(intruder, nullptr);
  std::atomic<int> answers{0};  // whatever prefill sends the intruder
  intruder->SetMessageHandler([&](std::string_view) { ++answers; });
  Result<PeerId> to_prefill = intruder->Connect(ManagerAccess::Of(prefill).transport().Address());
  ASSERT_TRUE(to_prefill.ok()) << to_prefill.status().ToString();
  RankId as = decode.self();
  as.instance = "intruder";
  as.pid += 1;
  const uint64_t dropped = prefill.Stats().unauthenticated_messages_dropped;
  const std::vector<std::string> addresses = MalformedAddresses(intruder->Address());
  for (size_t i = 0; i < addresses.size(); ++i) {
    HelloMsg h;
    h.layout = decode.layout();
    h.tp_size = h.layout.tp_size;
    h.address = addresses[i];
    h.kv_keys.assign(h.layout.kv.size(), "k");
    h.aux_keys.assign(h.layout.aux.size(), "k");
    h.state_keys.assign(h.layout.state.size(), "k");
    h.session = 0x100 + i;
    h.nonce.fill(static_cast<uint8_t>(i));
    // The last one under another deployment's secret; the others untagged.
    if (i + 1 == addresses.size())
      h.address_tag = HandshakeAuth("another deployment").TagAddress(h.address, h.session, h.nonce);
    ASSERT_TRUE(intruder->SendMessage(*to_prefill, EncodeMessage(as, h)).ok());
  }
  ASSERT_TRUE(WaitFor([&] {
    return prefill.Stats().unauthenticated_messages_dropped == dropped + addresses.size();
  })) << "prefill dropped "
      << prefill.Stats().unauthenticated_messages_dropped - dropped << " of " << addresses.size()
      << " Hellos";
  // Still alive, still serving its decode peer, and it answered none.
  Deliver(**c, 2);
  EXPECT_EQ(answers.load(), 0);
  EXPECT_EQ(prefill.Stats().rooms_failed, 0u);
}

// The tag covers the address, the session id and the nonce, under the
// deployment's secret only.
TEST(HostileHelloTest, TheAddressTagCoversAddressSessionAndNonceUnderOneSecret) {
  const HandshakeAuth mine(std::string(64, 's'));
  Nonce n{};
  n.fill(7);
  const Digest tag = mine.TagAddress("address", 42, n);
  EXPECT_TRUE(mine.CheckAddressTag("address", 42, n, tag, "decode tp0").ok());
  EXPECT_FALSE(mine.CheckAddressTag("addresS", 42, n, tag, "decode tp0").ok());
  EXPECT_FALSE(mine.CheckAddressTag("address", 43, n, tag, "decode tp0").ok());
  Nonce other = n;
  other[15] ^= 1;
  EXPECT_FALSE(mine.CheckAddressTag("address", 42, other, tag, "decode tp0").ok());
  const Status refused =
      HandshakeAuth(std::string(64, 't')).CheckAddressTag("address", 42, n, tag, "decode tp0");
  EXPECT_EQ(refused.code(), StatusCode::kUnauthenticated);
  EXPECT_NE(refused.message().find("decode tp0"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find(kAuthTokenEnv), std::string::npos) << refused.message();
}

// The record tag covers what decode connects to and where the rank stands,
// under one secret; it survives the record's JSON.
TEST(RecordTagTest, TheTagCoversTheAddressPositionAndIncarnationUnderOneSecret) {
  const HandshakeAuth mine(std::string(64, 's'));
  RankRecord r = registry_test::Prefill(1);
  r.instance = "p";
  r.address_tag = RankAddressTag(mine, r);
  EXPECT_EQ(r.address_tag.size(), 32u);
  EXPECT_TRUE(CheckRankAddressTag(mine, r, "registry").ok());
  Result<RankRecord> read = RankRecord::FromJson(r.ToJson());
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_TRUE(CheckRankAddressTag(mine, *read, "registry").ok());
  const std::vector<std::function<void(RankRecord&)>> changes = {
      [](RankRecord& x) { x.transport_address += "x"; },
      [](RankRecord& x) { x.attn_tp_rank = 0; },
      [](RankRecord& x) { x.attn_dp_rank = 1; },
      [](RankRecord& x) { x.attn_cp_rank = 1; },
      [](RankRecord& x) { x.host = "node-b"; },
      [](RankRecord& x) { x.boot_id = "another boot"; },
      [](RankRecord& x) { x.pid += 1; },
      [](RankRecord& x) { x.pp_rank = 1; },
      [](RankRecord& x) { x.incarnation += 1; },
      [](RankRecord& x) { x.instance = "q"; },
      [](RankRecord& x) { x.role = RankRole::kDecode; },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    RankRecord changed = r;
    changes[i](changed);
    const Status s = CheckRankAddressTag(mine, changed, "registry");
    EXPECT_EQ(s.code(), StatusCode::kUnauthenticated) << "change " << i;
    EXPECT_NE(s.message().find("does not check"), std::string::npos) << s.message();
  }
  const Status other = CheckRankAddressTag(HandshakeAuth(std::string(64, 't')), r, "registry");
  EXPECT_EQ(other.code(), StatusCode::kUnauthenticated);
  RankRecord untagged = r;
  untagged.address_tag.clear();
  const Status none = CheckRankAddressTag(mine, untagged, "http://10.0.0.9:8998");
  EXPECT_NE(none.message().find("carries no address tag"), std::string::npos) << none.message();
  EXPECT_NE(none.message().find("http://10.0.0.9:8998"), std::string::npos) << none.message();
  EXPECT_NE(none.message().find("bootstrap server, of an older build"), std::string::npos)
      << none.message();
  EXPECT_NE(other.message().find(kAuthTokenEnv), std::string::npos) << other.message();
  // A tag longer than any HMAC, or not base64, is a malformed record.
  nlohmann::json j = r.ToJson();
  j["address_tag"] = std::string(100, 'A');
  EXPECT_EQ(RankRecord::FromJson(j).status().code(), StatusCode::kInvalidArgument);
  j["address_tag"] = "not base64!";
  EXPECT_EQ(RankRecord::FromJson(j).status().code(), StatusCode::kInvalidArgument);
}

// What the rank endpoint of a prefill rank serves, as an impostor answering
// in its place (its port, after it exited) would: the rank's record with
// its address replaced by a malformed UCX address, the tag kept or dropped.
class ImpostorRankEndpoint {
 public:
  explicit ImpostorRankEndpoint(RankRecord served) : served_(std::move(served)) {
    http_.Get(kRankEndpointPath, [this](const httplib::Request&, httplib::Response& res) {
      ++answers_;
      res.set_content(served_.ToJson().dump(), "application/json");
    });
    const Status s = serving_.Start(http_, "127.0.0.1", 0, "impostor rank endpoint");
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  int port() const { return serving_.port(); }
  int answers() const { return answers_.load(); }

 private:
  const RankRecord served_;
  std::atomic<int> answers_{0};
  httplib::Server http_;
  HttpServerThread serving_;  // after http_: stops serving before it goes
};

// With sglang's server, decode reads a prefill rank's record from the
// rank's own endpoint over plain HTTP, and connected to the address it
// names: an impostor answering there with a malformed UCX address aborted
// the decode process inside ucp_ep_create. The request now fails at once,
// naming the record that did not check, and decode lives on.
TEST(HostileRecordTest, ADecodeRankConnectsToNoAddressWhoseTagDoesNotCheck) {
  auto c = TestCluster::Create(OverUcx(/*sglang_server=*/true));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto client = BootstrapClient::Create((*c)->bootstrap_address(), std::chrono::seconds(5),
                                        AuthTokenFromEnvironment());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  Result<RankRecord> real = (*client)->GetRank(0, 0, 0, 0);
  ASSERT_TRUE(real.ok()) << real.status().ToString();
  ASSERT_TRUE(CheckRankAddressTag(HandshakeAuth(AuthTokenFromEnvironment()), *real, "test").ok());
  KVManager& decode = *(*c)->decode[0].manager;
  uint64_t room = 1;
  for (bool keep_tag : {true, false}) {
    SCOPED_TRACE(keep_tag ? "the rank's tag kept" : "no tag");
    RankRecord forged = *real;
    forged.transport_address = MalformedAddresses(real->transport_address)[3];
    forged.host = "node-z";  // claims of the impostor's, which no record takes
    forged.pid = 4242;
    if (!keep_tag) forged.address_tag.clear();
    ImpostorRankEndpoint impostor(forged);
    ASSERT_TRUE((*c)->sglang_server->MoveRank(0, 0, 0, 0, impostor.port()));
    auto rx = std::move(KVReceiver::Create(decode, room++)).value();
    ASSERT_TRUE(rx->Init(0).ok());
    ASSERT_TRUE(WaitFor([&] { return rx->Poll() == KVPoll::kFailed; }));
    EXPECT_GE(impostor.answers(), 1);
    const std::optional<FailureRecord> f = rx->Failure();
    ASSERT_TRUE(f);
    EXPECT_EQ(f->mechanism, "registry record check") << f->Message();
    EXPECT_EQ(f->cause, FailureCause::kUnauthenticated) << f->Message();
    EXPECT_NE(f->origin.host, "node-z") << f->Message();
    EXPECT_NE(f->origin.pid, 4242) << f->Message();
    EXPECT_TRUE(f->origin.SameRank(ManagerAccess::Of(*(*c)->prefill[0].manager).self()))
        << f->Message();
    EXPECT_NE(f->detail.find(keep_tag ? "has an address tag that does not check"
                                      : "carries no address tag"),
              std::string::npos)
        << f->detail;
  }
  // The real rank listed again: decode meets it and a request goes through.
  ASSERT_TRUE((*c)->sglang_server->MoveRank(0, 0, 0, 0, real->rank_port));
  Deliver(**c, room);
}

}  // namespace
}  // namespace kvbridge::internal
