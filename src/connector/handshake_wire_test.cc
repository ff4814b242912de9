// The handshake's messages on the wire (protocol.h): what a hostile sender
// of a HelloProof gets, field by field.
#include <gtest/gtest.h>

#include <cstring>

#include "connector/protocol.h"

namespace kvbridge::internal {
namespace {

RankId DecodeRank() {
  RankId r;
  r.role = Role::kDecode;
  r.host = "host-a";
  r.pid = 1234;
  return r;
}

std::string Refusal(const std::string& bytes) {
  Result<Message> m = DecodeMessage(bytes);
  EXPECT_FALSE(m.ok()) << "accepted";
  if (m.ok()) return "";
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  return m.status().message();
}

// The handshake's fixed-size fields are exactly their size: a proof one
// byte short is refused naming it, never padded.
TEST(HandshakeWireTest, ShortNonceOrProofIsRejectedNamingTheField) {
  const std::string good = EncodeMessage(DecodeRank(), HelloProofMsg{0x22, Digest{6, 7}});
  // Layout: header, rank, u64 session, u32 length 32, 32 proof bytes, u32
  // length 0 (no Hello). Make the proof's length 31 and drop a byte of it.
  std::string bad = good.substr(0, good.size() - 5) + good.substr(good.size() - 4);
  const size_t len_at = good.size() - 4 - 32 - 4;
  bad[len_at] = 31;
  const std::string why = Refusal(bad);
  EXPECT_NE(why.find("proof of 31 bytes, not 32"), std::string::npos) << why;
  EXPECT_NE(why.find("(HelloProof)"), std::string::npos) << why;
}

// The Hello a proof carries (prefill keeps none, peer_auth.h) is bounded
// before anything is allocated for it, and must be all there.
TEST(HandshakeWireTest, TheHelloAProofCarriesIsBoundedAndWhole) {
  HelloProofMsg p{0x22, Digest{6, 7}, std::string(kMaxHelloBytes, 'h')};
  Result<Message> m = DecodeMessage(EncodeMessage(DecodeRank(), p));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(std::get<HelloProofMsg>(m->body).hello.size(), kMaxHelloBytes);

  const std::string good =
      EncodeMessage(DecodeRank(), HelloProofMsg{0x22, Digest{6, 7}, "a Hello"});
  std::string over = good.substr(0, good.size() - 7);  // the Hello's length is last
  const uint32_t too_long = kMaxHelloBytes + 1;
  std::memcpy(over.data() + over.size() - 4, &too_long, sizeof(too_long));
  std::string why = Refusal(over);
  EXPECT_NE(why.find("the Hello a proof answers of 16777217 bytes exceeds the limit"),
            std::string::npos)
      << why;
  why = Refusal(good.substr(0, good.size() - 1));
  EXPECT_NE(why.find("the Hello a proof answers of 7 bytes runs past the end"), std::string::npos)
      << why;
}

}  // namespace
}  // namespace kvbridge::internal
