// When the CUDA latency MoE backend hands a step to the throughput kernels (moe_cuda.h,
// moe_step_kernels). Plain C++ (no CUDA), so the CPU unit tests check the rule.
#pragma once

namespace serval::backend::moe {

// Tokens per expert (tokens·top_k / num_experts, routed anywhere) up to which the latency
// kernels beat the throughput ones on the H200 (one Qwen3-30B-A3B layer in a CUDA graph,
// bench/RESULTS.md): bf16 experts 31 (512 tokens: 339 µs throughput vs 365 latency; 256 tokens
// within 3 %), NVFP4 experts 63 (1024 tokens: 445 vs 469 µs; 512: 382 vs 287).
constexpr int moe_latency_max_tokens_per_expert(bool nvfp4) {
  return nvfp4 ? 63 : 31;
}

// True when a latency-backend step of num_tokens tokens runs the throughput kernels.
constexpr bool moe_latency_hands_over(int num_tokens, int top_k, int num_experts, bool nvfp4) {
  if (num_tokens <= 0 || top_k <= 0 || num_experts <= 0) return false;
  const long per_expert = long(num_tokens) * top_k / num_experts;
  return per_expert > moe_latency_max_tokens_per_expert(nvfp4);
}

}  // namespace serval::backend::moe
