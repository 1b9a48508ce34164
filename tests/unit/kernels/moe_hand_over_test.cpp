// The rule of the CUDA latency MoE backend's hand-over of large steps
// (backend/moe/moe_hand_over.h).
#include "backend/moe/moe_hand_over.h"

#include <gtest/gtest.h>

namespace serval::backend::moe {
namespace {

TEST(MoeHandOver, Bf16StepsPast31TokensPerExpert) {
  EXPECT_EQ(moe_latency_max_tokens_per_expert(false), 31);
  // Qwen3-30B-A3B: 128 experts, top-8: 512 tokens are 32 per expert.
  EXPECT_FALSE(moe_latency_hands_over(1, 8, 128, false));
  EXPECT_FALSE(moe_latency_hands_over(256, 8, 128, false));
  EXPECT_FALSE(moe_latency_hands_over(511, 8, 128, false));
  EXPECT_TRUE(moe_latency_hands_over(512, 8, 128, false));
  EXPECT_TRUE(moe_latency_hands_over(8192, 8, 128, false));
  // Mixtral-like: 8 experts, top-2: 128 tokens are 32 per expert.
  EXPECT_FALSE(moe_latency_hands_over(127, 2, 8, false));
  EXPECT_TRUE(moe_latency_hands_over(128, 2, 8, false));
}

TEST(MoeHandOver, Nvfp4StepsPast63TokensPerExpert) {
  EXPECT_EQ(moe_latency_max_tokens_per_expert(true), 63);
  EXPECT_FALSE(moe_latency_hands_over(1023, 8, 128, true));
  EXPECT_TRUE(moe_latency_hands_over(1024, 8, 128, true));
}

TEST(MoeHandOver, DegenerateShapesStayOnTheLatencyKernels) {
  EXPECT_FALSE(moe_latency_hands_over(0, 8, 128, false));
  EXPECT_FALSE(moe_latency_hands_over(8192, 0, 128, false));
  EXPECT_FALSE(moe_latency_hands_over(8192, 8, 0, false));
}

}  // namespace
}  // namespace serval::backend::moe
