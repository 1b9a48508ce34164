// Fused attention pre-processing: per-head q/k RMSNorm, neox RoPE and paged KV-cache append.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/dtype.h"

namespace serval::kernels::cuda {

// Input is the fused QKV projection: each row holds Hq q heads, then Hkv k heads, then Hkv
// v heads, D values each. For every token t:
//   q heads: (optional RMSNorm · q_norm) → RoPE(positions[t]) → q_out[t]
//   k heads: (optional RMSNorm · k_norm) → RoPE → k_cache[slot_mapping[t]] = cast(k · (1/k_scale))
//   v heads: v_cache[slot_mapping[t]] = cast(v · (1/v_scale))
// Tokens with slot_mapping[t] < 0 (padding) write q_out only. Math in fp32; angles are
// positions[t] · inv_freq[i] in fp32 with sincosf. The reciprocal 1/scale is taken in fp32 and
// the product rounded to fp32 before the cast, exactly as the CPU kv_append. Casts round to
// nearest even: bf16, or fp8 with saturation to the largest finite value (±448 e4m3,
// ±57344 e5m2; ±inf saturates too), bit-identical to serval::float_to_e4m3 / float_to_e5m2 for
// every non-NaN input (NaN stores a hardware NaN code, not necessarily 0x7F).
// head_dim ∈ {16, 32, 64, 128}. q_norm, k_norm and inv_freq are weights: the kernel reads them
// before waiting for the previous kernel of the stream (programmatic dependent launch), so they
// must not be written by the kernel launched just before.
struct QkNormRopeKvParams {
  const bf16* qkv;              // [num_tokens, (num_q_heads + 2·num_kv_heads)·head_dim]
  const bf16* q_norm;           // [head_dim] or null (no q/k norm)
  const bf16* k_norm;           // [head_dim] or null (both null or both set)
  const int32_t* positions;     // [num_tokens]
  const float* inv_freq;        // [head_dim / 2]
  const int32_t* slot_mapping;  // [num_tokens]: block · block_size + offset, < 0 = skip
  bf16* q_out;                  // [num_tokens, num_q_heads, head_dim]
  void* k_cache;                // [num_blocks, block_size, num_kv_heads, head_dim], cache_dtype
  void* v_cache;                // same
  int num_tokens, num_q_heads, num_kv_heads, head_dim;
  float eps;                             // RMSNorm epsilon
  DType cache_dtype = DType::kBF16;      // kBF16, kF8E4M3 or kF8E5M2
  float k_scale = 1.0f, v_scale = 1.0f;  // positive and finite
};

void qk_norm_rope_kv(const QkNormRopeKvParams& p, cudaStream_t stream);

// InvalidArgument unless p's norms, scales, head_dim and size are valid for qk_norm_rope_kv
// (which checks them itself; for the kernels that take its parameters, paged_attention_rope).
void check_qk_norm_rope_kv(const QkNormRopeKvParams& p);

}  // namespace serval::kernels::cuda
