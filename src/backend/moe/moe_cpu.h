// The MoE pipeline on the CPU: router → dispatch → experts → combine (the oracle for GPU paths).
#pragma once

#include <cstdint>
#include "backend/backend.h"

namespace serval::backend::moe {

// Tokens grouped by expert: for local expert e, pairs [offsets[e], offsets[e+1]) of
// (token, weight) in token order.
struct Dispatch {
  std::vector<int32_t> offsets;  // [num_local + 1]
  std::vector<int32_t> token;    // [num_pairs]
  std::vector<float> weight;     // [num_pairs]
};

// Routes x's router logits [T, E] and groups (token, weight) pairs by local expert; pairs that
// go to experts outside the local slice are dropped (they contribute zero on this rank).
Dispatch dispatch(const float* router_logits, int num_tokens, const MoeWeights& w);

// x [T, hidden] f32 → out [T, hidden] f32.
void moe_forward_cpu(const float* x, int num_tokens, const MoeWeights& w, float* out);

}  // namespace serval::backend::moe
