// A Hello's address reaches the transport before anything in the Hello is
// proven: prefill connects back to it to send its challenge. UCX's parser of
// a worker address trusts its input, so one Hello from anyone who reached a
// prefill rank, naming a malformed address (the blob's CRC is no secret),
// aborted that rank inside ucp_ep_create ("address.c: Assertion
// `*addr_version == UCP_OBJECT_VERSION_V2' failed"). Prefill now connects
// back only to an address a holder of the deployment's secret tagged
// (HandshakeAuth::TagAddress).
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include "connector/connector_test_util.h"
#include "connector/manager_impl.h"
#include "connector/peer_auth.h"
#include "connector/protocol.h"
#include "control/auth.h"
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

TEST(HostileHelloTest, AMalformedAddressNotTaggedUnderTheSecretReachesNoUcxParser) {
  ClusterOptions o;
  o.tweak = TolerantLiveness;
  o.wrap = [](std::unique_ptr<Transport>, Role r, int) -> std::unique_ptr<Transport> {
    return testing::MakeUcxForTest(
        testing::TcpTestOptions(r == Role::kPrefill ? "prefill" : "decode", false));
  };
  auto c = TestCluster::Create(o);
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

}  // namespace
}  // namespace kvbridge::internal
