// CPU twin of the fused CUDA qk-norm + RoPE + KV-append kernel, composed from the fp32 CPU ops.
#pragma once
#include <cstdint>

namespace serval::kernels::cpu {

// See kernels/cuda/norm_rope/qk_norm_rope_kv.h for the contract; everything here is fp32.
struct QkNormRopeKvParams {
  const float* qkv;             // [num_tokens, (num_q_heads + 2·num_kv_heads)·head_dim]
  const float* q_norm;          // [head_dim] or null
  const float* k_norm;          // [head_dim] or null
  const int32_t* positions;     // [num_tokens]
  const float* inv_freq;        // [head_dim / 2]
  const int32_t* slot_mapping;  // [num_tokens]
  float* q_out;                 // [num_tokens, num_q_heads, head_dim]
  float* k_cache;               // [num_blocks, block_size, num_kv_heads, head_dim]
  float* v_cache;
  int num_tokens, num_q_heads, num_kv_heads, head_dim;
  float eps;
};

void qk_norm_rope_kv(const QkNormRopeKvParams& p);

}  // namespace serval::kernels::cpu
