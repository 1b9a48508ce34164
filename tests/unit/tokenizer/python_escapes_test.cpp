// Python's str-literal escapes (python_escapes.h), against what Python itself gives for each
// (the expected bytes were written from `python3 -c "print(repr('...'.encode()))"`).
#include "tokenizer/python_escapes.h"

#include <gtest/gtest.h>

namespace serval::tokenizer {
namespace {

TEST(PythonEscapes, ResolvesEveryKind) {
  EXPECT_EQ(python_unescape(R"(a\\b\'c\"d)"), "a\\b'c\"d");
  EXPECT_EQ(python_unescape(R"(\a\b\f\n\r\t\v)"), "\a\b\f\n\r\t\v");
  EXPECT_EQ(python_unescape(R"(\101\60\0x)"), std::string("A0\0x", 4));  // octal, 1-3 digits
  EXPECT_EQ(python_unescape(R"(\x41\xe9)"), "A\xc3\xa9");                 // é as UTF-8
  EXPECT_EQ(python_unescape(R"(\u20ac\U0001F600)"), "\xe2\x82\xac\xf0\x9f\x98\x80");
  EXPECT_EQ(python_unescape("line\\\ncontinued"), "linecontinued");
  EXPECT_EQ(python_unescape(R"(\d\q)"), "\\d\\q");  // unknown: kept
  EXPECT_EQ(python_unescape("é and \\"), "é and \\");  // a trailing backslash passes
  EXPECT_EQ(python_unescape(""), "");
}

TEST(PythonEscapes, RefusesMalformedOrUnencodable) {
  for (const char* bad : {R"(\x4)", R"(\xZZ)", R"(\u12)", R"(\U0001F60)", R"(\ud800)",
                          R"(\U00110000)", R"(\uDFFF)"})
    EXPECT_FALSE(python_unescape(bad).has_value()) << bad;
}

}  // namespace
}  // namespace serval::tokenizer
