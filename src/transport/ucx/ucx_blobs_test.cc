#include "transport/ucx/ucx_blobs.h"

#include <gtest/gtest.h>

namespace kvbridge::internal::ucx {
namespace {

RemoteKeyBlob SampleKey(bool with_segment) {
  RemoteKeyBlob b;
  b.owner = HostIdentity{"host-a", "boot-1", 1234};
  b.region_id = 7;
  b.base = 0x7f0000001000;
  b.length = 1 << 20;
  b.kind = MemoryKind::kDram;
  b.packed_rkey = std::string("\x01\x02\x00\x03packed", 10);
  for (size_t i = 0; i < b.token.bytes.size(); ++i) b.token.bytes[i] = static_cast<uint8_t>(i + 1);
  if (with_segment) {
    b.same_host_socket = "kvbridge-1234-00ff";
    b.shareable = true;
  }
  return b;
}

TEST(UcxBlobsTest, AddressRoundTrips) {
  AddressBlob in{HostIdentity{"h", "b", 42}, std::string("\0worker\xff", 8)};
  auto out = DecodeAddress(EncodeAddress(in));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->host.host, "h");
  EXPECT_EQ(out->host.boot_id, "b");
  EXPECT_EQ(out->host.pid, 42);
  EXPECT_EQ(out->worker_address, in.worker_address);
  EXPECT_EQ(out->network_address, "");
  in.network_address = "net";
  out = DecodeAddress(EncodeAddress(in));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->network_address, "net");
}

TEST(UcxBlobsTest, RemoteKeyRoundTripsWithAndWithoutSegment) {
  for (bool seg : {false, true}) {
    RemoteKeyBlob in = SampleKey(seg);
    auto out = DecodeRemoteKey(EncodeRemoteKey(in));
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    EXPECT_EQ(out->owner.pid, 1234);
    EXPECT_EQ(out->region_id, 7u);
    EXPECT_EQ(out->base, in.base);
    EXPECT_EQ(out->length, in.length);
    EXPECT_EQ(out->packed_rkey, in.packed_rkey);
    EXPECT_TRUE(TokensEqual(out->token, in.token));
    EXPECT_EQ(out->same_host_socket, in.same_host_socket);
    EXPECT_EQ(out->shareable, seg);
  }
}

TEST(UcxBlobsTest, EveryFlippedByteOrTruncationIsInvalidArgument) {
  const std::string key = EncodeRemoteKey(SampleKey(true));
  const std::string addr = EncodeAddress(AddressBlob{HostIdentity{"h", "b", 1}, "addr"});
  for (size_t i = 0; i < key.size(); ++i) {
    std::string bad = key;
    bad[i] ^= 0x20;
    EXPECT_EQ(DecodeRemoteKey(bad).status().code(), StatusCode::kInvalidArgument) << i;
    EXPECT_EQ(DecodeRemoteKey(key.substr(0, i)).status().code(), StatusCode::kInvalidArgument);
  }
  for (size_t i = 0; i < addr.size(); ++i) {
    std::string bad = addr;
    bad[i] ^= 0x01;
    EXPECT_EQ(DecodeAddress(bad).status().code(), StatusCode::kInvalidArgument) << i;
  }
  // A remote key is not an address and vice versa.
  EXPECT_EQ(DecodeAddress(key).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeRemoteKey(addr).status().code(), StatusCode::kInvalidArgument);
}

TEST(UcxBlobsTest, HostileFieldsAreInvalidArgument) {
  // A socket name longer than any abstract unix address, and a token of the
  // wrong size, are refused before anything is used.
  RemoteKeyBlob b = SampleKey(true);
  b.same_host_socket = std::string(101, 'x');
  EXPECT_EQ(DecodeRemoteKey(EncodeRemoteKey(b)).status().code(), StatusCode::kInvalidArgument);
  b = SampleKey(false);
  b.base = ~uint64_t{0} - 10;  // base + length wraps
  EXPECT_EQ(DecodeRemoteKey(EncodeRemoteKey(b)).status().code(), StatusCode::kInvalidArgument);
  b.base = 0;
  EXPECT_EQ(DecodeRemoteKey(EncodeRemoteKey(b)).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvbridge::internal::ucx
