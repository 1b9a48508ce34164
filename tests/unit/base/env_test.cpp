// Strict whole-number settings from the environment (base/env.h).
#include "base/env.h"

#include <gtest/gtest.h>
#include <stdlib.h>

namespace serval {
namespace {

TEST(Env, IntegersParseWholeAndInRange) {
  EXPECT_EQ(parse_int_in("1", 1, 4096), 1);
  EXPECT_EQ(parse_int_in("16", 1, 4096), 16);
  EXPECT_EQ(parse_int_in("4096", 1, 4096), 4096);
  EXPECT_EQ(parse_int_in("-3", -5, 5), -3);
  for (const char* bad :
       {"", "0", "-2", "4097", "8 ", " 8", "8x", "abc", "1.5", "+8", "99999999999999999999"})
    EXPECT_EQ(parse_int_in(bad, 1, 4096), std::nullopt) << "'" << bad << "'";
}

TEST(Env, UnsetOrMalformedVariablesTakeTheFallback) {
  const char* name = "SERVAL_ENV_TEST_VALUE";
  unsetenv(name);
  EXPECT_EQ(env_int(name, 0, 100, 7), 7);
  setenv(name, "42", 1);
  EXPECT_EQ(env_int(name, 0, 100, 7), 42);
  for (const char* bad : {"abc", "8x", "101", "", "-1"}) {
    setenv(name, bad, 1);
    EXPECT_EQ(env_int(name, 0, 100, 7), 7) << "'" << bad << "'";
  }
  unsetenv(name);
}

}  // namespace
}  // namespace serval
