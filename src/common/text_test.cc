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

constexpr const char* kR = "\xEF\xBF\xBD";  // U+FFFD

TEST(ValidUtf8Test, ValidTextComesBackAsIs) {
  for (const std::string text :
       {std::string(), std::string("plain ascii"), std::string("ab\xC3\xA9 x\xE2\x82\xAC"),
        std::string("\xF0\x9F\x98\x80 \xF4\x8F\xBF\xBF \xED\x9F\xBF"),  // U+1F600, U+10FFFF, U+D7FF
        std::string("nul \0 inside", 13)})
    EXPECT_EQ(ValidUtf8(text), text);
}

TEST(ValidUtf8Test, EachByteThatIsNotPartOfACharacterBecomesOneReplacement) {
  const std::string r = kR;
  EXPECT_EQ(ValidUtf8("\xFF"), r);
  EXPECT_EQ(ValidUtf8("a\x80\x80"
                      "b"),
            "a" + r + r + "b");                                    // lone continuations
  EXPECT_EQ(ValidUtf8("\xC0\x80"), r + r);                         // overlong NUL
  EXPECT_EQ(ValidUtf8("\xE0\x80\xAF"), r + r + r);                 // overlong '/'
  EXPECT_EQ(ValidUtf8("\xED\xA0\x80"), r + r + r);                 // a surrogate
  EXPECT_EQ(ValidUtf8("\xF4\x90\x80\x80"), r + r + r + r);         // past U+10FFFF
  EXPECT_EQ(ValidUtf8("\xF5\x80"), r + r);                         // never a lead byte
  EXPECT_EQ(ValidUtf8("x\xE2\x82"), "x" + r + r);                  // cut at the end
  EXPECT_EQ(ValidUtf8("\xE2\x82x\xC3\xA9"), r + r + "x\xC3\xA9");  // cut, then valid
}

}  // namespace
}  // namespace kvbridge::internal
