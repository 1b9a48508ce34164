// The Responses API's store: the most recent responses within a count and a byte bound, the
// oldest dropped first, one too large for the bound not kept.
#include "server/response_store.h"

#include <gtest/gtest.h>

#include <string>

namespace serval::server {
namespace {

StoredResponse response_of(size_t text_bytes) {
  return {Json::array({Json{{"role", "user"}, {"content", std::string(text_bytes, 'x')}}}),
          Json{{"id", "r"}, {"text", "\xff not UTF-8"}}};
}

TEST(ResponseStore, KeepsTheMostRecentWithinItsBounds) {
  ResponseStore store(/*capacity=*/8, /*max_bytes=*/1 << 20);
  for (size_t i = 0; i < 8 + 3; ++i) store.put(std::to_string(i), response_of(10));
  EXPECT_FALSE(store.get("0").has_value());  // the three oldest went
  EXPECT_FALSE(store.get("2").has_value());
  EXPECT_TRUE(store.get("3").has_value());
  EXPECT_TRUE(store.get("10").has_value());

  EXPECT_TRUE(store.erase("3"));
  EXPECT_FALSE(store.erase("3"));
  EXPECT_FALSE(store.get("3").has_value());

  // Bytes: two responses of 40 % of the bound each fit, a third drops the oldest of them.
  constexpr size_t kMax = 100000;
  ResponseStore big(/*capacity=*/8, kMax);
  const size_t part = kMax * 4 / 10;
  big.put("a", response_of(part));
  big.put("b", response_of(part));
  EXPECT_TRUE(big.get("a").has_value());
  big.put("c", response_of(part));
  EXPECT_FALSE(big.get("a").has_value());
  EXPECT_TRUE(big.get("b").has_value() && big.get("c").has_value());
  EXPECT_LE(big.bytes(), kMax);
  big.put("huge", response_of(kMax));  // larger than the bound: not kept
  EXPECT_FALSE(big.get("huge").has_value());
  EXPECT_TRUE(big.get("c").has_value());
  big.put("c", response_of(1));  // kept again under the same id: its old bytes released
  EXPECT_LT(big.bytes(), part + 1000);
}

}  // namespace
}  // namespace serval::server
