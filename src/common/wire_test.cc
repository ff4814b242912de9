#include "common/wire.h"

#include <gtest/gtest.h>

namespace kvbridge::internal {
namespace {

TEST(WireTest, RoundTripWithCrc) {
  WireWriter w;
  w.U8(7);
  w.U32(0xdeadbeef);
  w.U64(1ull << 40);
  w.I64(-5);
  w.Bytes("hello");
  std::string blob = w.FinishWithCrc();

  WireReader r(blob);
  ASSERT_TRUE(r.CheckCrc());
  uint8_t a;
  uint32_t b;
  uint64_t c;
  int64_t d;
  std::string e;
  ASSERT_TRUE(r.U8(&a) && r.U32(&b) && r.U64(&c) && r.I64(&d) && r.Bytes(&e));
  EXPECT_EQ(a, 7);
  EXPECT_EQ(b, 0xdeadbeefu);
  EXPECT_EQ(c, 1ull << 40);
  EXPECT_EQ(d, -5);
  EXPECT_EQ(e, "hello");
  EXPECT_TRUE(r.AtEnd());
}

TEST(WireTest, GarbledBlobFailsCrc) {
  WireWriter w;
  w.Bytes("remote key");
  std::string blob = w.FinishWithCrc();
  for (size_t i = 0; i < blob.size(); ++i) {
    std::string bad = blob;
    bad[i] ^= 0x10;
    WireReader r(bad);
    EXPECT_FALSE(r.CheckCrc()) << "flip at byte " << i;
  }
  WireReader empty("");
  EXPECT_FALSE(empty.CheckCrc());
}

TEST(WireTest, TruncatedReadsFail) {
  WireWriter w;
  w.Bytes("abcdef");
  std::string blob = w.Finish();
  blob.resize(blob.size() - 2);
  WireReader r(blob);
  std::string s;
  EXPECT_FALSE(r.Bytes(&s));
  WireReader r2("ab");
  uint32_t v;
  EXPECT_FALSE(r2.U32(&v));
}

TEST(WireTest, Crc32KnownValue) { EXPECT_EQ(Crc32("123456789"), 0xCBF43926u); }

}  // namespace
}  // namespace kvbridge::internal
