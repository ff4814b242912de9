#include "common/wire.h"

#include <gtest/gtest.h>

#include <climits>
#include <vector>

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

TEST(WireTest, IntRejectsInt64OutsideTheRangeInsteadOfTruncating) {
  struct Case {
    int64_t value;
    bool ok;
  };
  // (1 << 32) + 1 used to arrive as 1: a truncation a peer could steer.
  for (Case c : std::vector<Case>{{0, true},
                                  {1024, true},
                                  {1025, false},
                                  {-1, false},
                                  {(int64_t{1} << 32) + 1, false},
                                  {INT64_MAX, false},
                                  {INT64_MIN, false}}) {
    WireWriter w;
    w.I64(c.value);
    std::string blob = w.Finish();
    WireReader r(blob);
    int v = -7;
    EXPECT_EQ(r.Int("tp", &v, 0, 1024), c.ok) << c.value;
    if (c.ok) {
      EXPECT_EQ(v, c.value);
      EXPECT_EQ(r.error(), "");
    } else {
      EXPECT_EQ(v, -7) << "output set on failure";
      EXPECT_EQ(r.error(), "tp " + std::to_string(c.value) + " out of range [0, 1024]");
    }
  }
  int wide = 0;
  WireWriter w;
  w.I64(int64_t{INT32_MAX} + 1);
  std::string blob = w.Finish();
  WireReader r(blob);
  EXPECT_FALSE(r.Int("pid", &wide, 0, INT32_MAX));
}

TEST(WireTest, BoundedBytesAndCountNameTheLimit) {
  WireWriter w;
  w.Bytes(std::string(300, 'h'));
  std::string blob = w.Finish();
  std::string s;
  WireReader r(blob);
  EXPECT_FALSE(r.BoundedBytes("host", &s, 256));
  EXPECT_EQ(r.error(), "host of 300 bytes exceeds the limit of 256");
  EXPECT_TRUE(s.empty());
  WireReader fits(blob);
  EXPECT_TRUE(fits.BoundedBytes("host", &s, 300));
  EXPECT_EQ(s.size(), 300u);

  // A count of 2^30 four-byte elements in a 4-byte blob: refused before
  // anything is allocated, whatever the limit.
  WireWriter c;
  c.U32(1u << 30);
  blob = c.Finish();
  uint32_t n = 0;
  WireReader big(blob);
  EXPECT_FALSE(big.Count("pages", &n, 4, 1u << 20));
  EXPECT_EQ(big.error(), "pages 1073741824 exceeds the limit of 1048576");
  WireReader unfit(blob);
  EXPECT_FALSE(unfit.Count("pages", &n, 4, UINT32_MAX));
  EXPECT_EQ(unfit.error(), "pages 1073741824 cannot fit in the 0 bytes left");
  EXPECT_EQ(n, 0u);
}

TEST(WireTest, FirstFailureIsKeptAndTruncationIsNamed) {
  WireReader r("ab");
  uint32_t v;
  EXPECT_FALSE(r.U32(&v));
  EXPECT_EQ(r.error(), "truncated at byte 0");
  int x;
  EXPECT_FALSE(r.Int("dp", &x, 0, 1));
  EXPECT_EQ(r.error(), "dp missing: input ends at byte 0 of 2");
  EXPECT_FALSE(r.Fail("later"));
  EXPECT_EQ(r.error(), "dp missing: input ends at byte 0 of 2");
}

TEST(WireTest, Crc32KnownValue) { EXPECT_EQ(Crc32("123456789"), 0xCBF43926u); }

}  // namespace
}  // namespace kvbridge::internal
