// The multi-node step plan: encode → decode gives the same chunks (only the new tokens travel:
// positions start .. start + num_new − 1), the setup message round-trips, and malformed or random
// bytes are rejected with dist::DistError, never read out of bounds.
#include <gtest/gtest.h>

#include <random>

#include "dist/dist_error.h"
#include "runtime/step_plan.h"

namespace serval::runtime {
namespace {

TEST(StepPlan, RoundTripsChunks) {
  const std::vector<int32_t> a{5, 6, 7, 8, 9, 10}, a_blocks{3, 4};
  const std::vector<int32_t> b{1, 2, 3}, b_blocks{0};
  const std::vector<SeqChunk> chunks{{a, 2, 3, a_blocks, SeqChunk::Logits::kAll},
                                     {b, 2, 1, b_blocks, SeqChunk::Logits::kLast},
                                     {b, 0, 2, b_blocks, SeqChunk::Logits::kNone}};
  auto decoded = decode_plan(encode_step_plan(chunks));
  ASSERT_TRUE(std::holds_alternative<StepPlan>(decoded));
  const std::vector<SeqChunk> got = std::get<StepPlan>(decoded).views();
  ASSERT_EQ(got.size(), chunks.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const SeqChunk& w = chunks[i];
    EXPECT_EQ(got[i].start, w.start);
    EXPECT_EQ(got[i].num_new, w.num_new);
    EXPECT_EQ(got[i].logits, w.logits);
    ASSERT_EQ(got[i].tokens.size(), size_t(w.start + w.num_new));
    const auto sent = w.tokens.subspan(size_t(w.start), size_t(w.num_new));
    EXPECT_EQ(std::vector<int32_t>(got[i].tokens.begin() + w.start, got[i].tokens.end()),
              std::vector<int32_t>(sent.begin(), sent.end()));
    EXPECT_EQ(std::vector<int32_t>(got[i].block_table.begin(), got[i].block_table.end()),
              std::vector<int32_t>(w.block_table.begin(), w.block_table.end()));
  }
}

TEST(StepPlan, RoundTripsSetup) {
  auto decoded = decode_plan(encode_setup_plan({12345}));
  ASSERT_TRUE(std::holds_alternative<SetupPlan>(decoded));
  EXPECT_EQ(std::get<SetupPlan>(decoded).num_blocks, 12345);
}

TEST(StepPlan, RejectsMalformedPlans) {
  const std::vector<int32_t> t{1, 2, 3, 4}, blocks{0};
  const std::vector<SeqChunk> chunks{{t, 1, 3, blocks}};
  const std::vector<uint8_t> good = encode_step_plan(chunks);
  for (size_t cut = 0; cut < good.size(); ++cut)
    EXPECT_THROW(decode_plan({good.data(), cut}), dist::DistError) << "cut at " << cut;
  std::vector<uint8_t> trailing = good;
  trailing.push_back(0);
  EXPECT_THROW(decode_plan(trailing), dist::DistError);
  std::vector<uint8_t> bad_tag = good;
  bad_tag[0] = 9;
  EXPECT_THROW(decode_plan(bad_tag), dist::DistError);
  std::vector<uint8_t> bad_logits = good;
  bad_logits[1 + 4 + 8] = 7;  // tag, count, start, num_new, then the logits byte
  EXPECT_THROW(decode_plan(bad_logits), dist::DistError);
  std::vector<uint8_t> bad_len = good;
  bad_len[1 + 4 + 4] = 9;  // num_new 9 with 3 new tokens
  EXPECT_THROW(decode_plan(bad_len), dist::DistError);
  std::vector<uint8_t> huge_count = good;
  huge_count[1] = huge_count[2] = huge_count[3] = huge_count[4] = 0xFF;
  EXPECT_THROW(decode_plan(huge_count), dist::DistError);
  EXPECT_THROW(decode_plan(encode_setup_plan({0})), dist::DistError);
}

TEST(StepPlan, FuzzedBytesNeverCrash) {
  std::mt19937 rng(7);
  const std::vector<int32_t> t{1, 2, 3, 4, 5}, blocks{0, 1};
  const std::vector<SeqChunk> chunks{{t, 0, 5, blocks}, {t, 4, 1, blocks}};
  const std::vector<uint8_t> good = encode_step_plan(chunks);
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<uint8_t> bytes = good;
    const int flips = 1 + int(rng() % 4);
    for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] = uint8_t(rng());
    if (rng() % 4 == 0) bytes.resize(rng() % (bytes.size() + 1));
    try {
      auto decoded = decode_plan(bytes);
      if (auto* plan = std::get_if<StepPlan>(&decoded)) {
        for (const SeqChunk& c : plan->views())
          ASSERT_EQ(size_t(c.start + c.num_new), c.tokens.size());
      }
    } catch (const dist::DistError&) {
    }
  }
}

}  // namespace
}  // namespace serval::runtime
