#include "common/text.h"

#include <gtest/gtest.h>

#include <string>

namespace kvbridge::internal {
namespace {

TEST(Utf8PrefixTest, CutsBeforeACharacterItWouldSplit) {
  const std::string text =
      "ab\xC3\xA9"
      "cd";  // "abécd": é is two bytes
  EXPECT_EQ(Utf8Prefix(text, 10), text);
  EXPECT_EQ(Utf8Prefix(text, 4), "ab\xC3\xA9");
  EXPECT_EQ(Utf8Prefix(text, 3), "ab");      // not "ab\xC3"
  const std::string euro = "x\xE2\x82\xAC";  // "x€": € is three bytes
  EXPECT_EQ(Utf8Prefix(euro, 3), "x");
  EXPECT_EQ(Utf8Prefix(euro, 2), "x");
  EXPECT_EQ(Utf8Prefix(euro, 0), "");
}

TEST(Utf8PrefixTest, BytesThatAreNotUtf8AreCutAsTheyCome) {
  const std::string garbage(10, '\x80');         // continuation bytes only
  EXPECT_EQ(Utf8Prefix(garbage, 5).size(), 2u);  // backs off three at most
  EXPECT_EQ(Utf8Prefix(std::string(10, '\xFF'), 5).size(), 5u);
}

}  // namespace
}  // namespace kvbridge::internal
