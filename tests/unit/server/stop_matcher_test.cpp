// StopMatcher: stop strings across piece boundaries, hold-back, flush, include_stop.
#include "server/stop_matcher.h"

#include <gtest/gtest.h>

#include <string>

namespace serval::server {
namespace {

TEST(StopMatcher, FindsStopSplitAcrossPiecesAndDropsIt) {
  StopMatcher m({"lo w"});
  std::string out;
  for (const char* piece : {"hel", "l", "o", " ", "wor", "ld"}) out += m.push(piece);
  EXPECT_EQ(out, "hel");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("more"), "");
}

TEST(StopMatcher, HoldsBackOnlyPossiblePrefixes) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.push("abcE"), "abc");  // "E" could start END
  EXPECT_EQ(m.push("N"), "");        // "EN" still could
  EXPECT_EQ(m.push("x"), "ENx");     // not a stop after all
  EXPECT_EQ(m.push("yE"), "y");
  EXPECT_EQ(m.flush(), "E");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, EarliestOfSeveralStopsWins) {
  StopMatcher m({"cd", "b"});
  EXPECT_EQ(m.push("abcd"), "a");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcher, IncludeStopKeepsTheMatchedStringOnly) {
  StopMatcher m({"lo w"}, /*include_stop=*/true);
  std::string out;
  for (const char* piece : {"hel", "l", "o", " ", "wor", "ld"}) out += m.push(piece);
  EXPECT_EQ(out, "hello w");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, IncludeStopTakesTheLongestStopAtTheEarliestPlace) {
  StopMatcher m({"b", "bcd", "cd"}, /*include_stop=*/true);
  EXPECT_EQ(m.push("abcde"), "abcd");
  StopMatcher plain({"b", "bcd"});
  EXPECT_EQ(plain.push("abcde"), "a");
}

TEST(StopMatcher, NoStopsPassesEverything) {
  StopMatcher m({"", ""});
  EXPECT_EQ(m.push("abc"), "abc");
  EXPECT_EQ(m.flush(), "");
}

}  // namespace
}  // namespace serval::server
