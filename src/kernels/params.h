// Plain-data parameters of every kernel; the CPU twins and the CUDA kernels share them.
// Activations are float (CPU) unless a field says otherwise; weights carry their dtype.
#pragma once
#include <cstdint>

#include "base/dtype.h"

namespace serval::kernels {

struct EmbeddingParams {
  const void* table;  // [vocab, hidden], table_dtype
  DType table_dtype;
  const int32_t* ids;  // [num_tokens]
  float* out;          // [num_tokens, hidden]
  int num_tokens, hidden, vocab;
};

// out = rms_norm(x (+ residual)) * weight. With `residual` non-null, residual += x first and
// the sum is normalized (x may alias out).
struct RmsNormParams {
  const float* x;      // [rows, hidden]
  float* residual;     // [rows, hidden] or null
  const void* weight;  // [hidden], weight_dtype
  DType weight_dtype;
  float* out;  // [rows, hidden]
  int rows, hidden;
  float eps;
};

// y = x · Wᵀ (+ bias)
struct LinearParams {
  const float* x;  // [m, k]
  const void* w;   // [n, k], w_dtype
  DType w_dtype;
  const void* bias;  // [n] (w_dtype) or null
  float* y;          // [m, n]
  int m, n, k;
};

// Storage formats of quantized linear weights (SPEC §2.1, §2.3).
enum class WeightFormat : uint8_t {
  kNvfp4,          // E2M1 codes u8 [n, k/2] (element 2i low nibble), E4M3 scale per 16 along k
  kFp8PerTensor,   // E4M3 [n, k], one scale
  kFp8PerChannel,  // E4M3 [n, k], one f32 scale per output row
  kFp8Block,       // E4M3 [n, k], one f32 scale per block_n x block_k tile
};

// y = x · Wᵀ (+ bias) with W dequantized on the fly, row by row, into fp32:
//   NVFP4:           w[r, c] = (e2m1(q[r, c]) · e4m3(scales[r, c/16])) · global_scale
//   FP8 per-tensor:  w[r, c] = e4m3(q[r, c]) · global_scale
//   FP8 per-channel: w[r, c] = e4m3(q[r, c]) · scales[r]
//   FP8 block:       w[r, c] = e4m3(q[r, c]) · scales[r / block_n, c / block_k]
// (float products in this order; e2m1 · e4m3 is exact, so only the last product rounds).
struct QuantLinearParams {
  const float* x;  // [m, k]
  WeightFormat format;
  const uint8_t* w;  // NVFP4 [n, k/2]; FP8 [n, k]
  // NVFP4: u8 e4m3 [n, k/16]; per-channel: f32 [n]; block: f32 [ceil(n/block_n),
  // ceil(k/block_k)]; per-tensor: unused (null).
  const void* scales;
  float global_scale;    // NVFP4 weight_scale_2; FP8 per-tensor weight_scale; else unused
  int block_n, block_k;  // FP8 block only
  const void* bias;      // [n] in bias_dtype, or null
  DType bias_dtype;
  float* y;     // [m, n]
  int m, n, k;  // NVFP4: k % 16 == 0
};

// Rotary embedding, "neox" layout (first half / second half of each head), in place.
struct RopeParams {
  float* q;                  // [num_tokens, num_q_heads, head_dim]
  float* k;                  // [num_tokens, num_kv_heads, head_dim]
  const int32_t* positions;  // [num_tokens]
  const float* inv_freq;     // [rotary_dim / 2]
  int num_tokens, num_q_heads, num_kv_heads, head_dim;
};

// Writes new K/V rows into the paged cache: token t goes to slot_mapping[t] = block·bs + offset.
// The cache holds cache_dtype (f32, bf16, fp8 e4m3 or e5m2): stored k8 = cast(k / k_scale),
// likewise v with v_scale (scales are 1 unless an fp8 checkpoint provides them).
struct KvAppendParams {
  const float* k;  // [num_tokens, num_kv_heads, head_dim]
  const float* v;
  const int32_t* slot_mapping;  // [num_tokens]
  void* k_cache;                // [num_blocks, block_size, num_kv_heads, head_dim]
  void* v_cache;
  int num_tokens, num_kv_heads, head_dim;
  DType cache_dtype = DType::kF32;
  float k_scale = 1.0f, v_scale = 1.0f;
};

// Causal attention of each sequence's new tokens over its paged KV (which already holds them).
// Sequence s has query rows [query_start[s], query_start[s+1]) at positions
// context_len[s] - query_len .. context_len[s] - 1.
struct PagedAttentionParams {
  const float* q;       // [num_tokens, num_q_heads, head_dim]
  float* out;           // [num_tokens, num_q_heads, head_dim]
  const void* k_cache;  // [num_blocks, block_size, num_kv_heads, head_dim], cache_dtype
  const void* v_cache;
  const int32_t* query_start;   // [num_seqs + 1]
  const int32_t* context_lens;  // [num_seqs]
  const int32_t* block_tables;  // [num_seqs, max_blocks_per_seq]
  int num_seqs, max_blocks_per_seq, block_size;
  int num_q_heads, num_kv_heads, head_dim;
  float scale;  // softmax scale (1/sqrt(head_dim), times k_scale for fp8 KV)
  DType cache_dtype = DType::kF32;
  float v_scale = 1.0f;  // applied to the output (the stored v is v / v_scale)
};

// MLA (multi-head latent attention, DeepSeek-V2/V3) in its absorbed form. A token's cache row is
// [latent_dim + rope_dim]: its normalized compressed KV c, then its rotated rope key k_pe. Query
// head h scores row j as (q_lat[h] · c_j + q_pe[h] · k_pe_j) · scale, and its output is
// Σ_j p_j · c_j: the value is the row's first latent_dim entries (the per-head key and value
// projections are folded into q_lat before and applied to the output after).
//
// Rotary: the rope dims of a vector x pair as (x[i], x[i + rope_dim/2]) (neox), or, when
// rope_interleaved, as (x[2i], x[2i+1]); either way the rotated vector is stored in neox order
// (out[i], out[i + rope_dim/2]) = (x_a·cos − x_b·sin, x_b·cos + x_a·sin), angle position ·
// inv_freq[i], times rope_scale (YaRN's attention factor). Scores only take dot products of
// rotated vectors, so the order is free.

// Step 1 of a layer: the new tokens' cache rows (c = RMSNorm(kv[:, :latent_dim]) · kv_norm,
// k_pe = rotated kv[:, latent_dim:]), stored / k_scale in cache_dtype at slot_mapping (slots < 0
// skipped), and the queries' rope parts rotated.
struct MlaPrepareParams {
  const float* kv;      // [num_tokens, latent_dim + rope_dim]: the kv_a projection's output
  const void* kv_norm;  // [latent_dim], kv_norm_dtype
  DType kv_norm_dtype;
  const float* q;               // [num_tokens, num_heads, q_stride]: rope part at q_rope_offset
  float* q_pe;                  // out [num_tokens, num_heads, rope_dim]: rotated
  const int32_t* positions;     // [num_tokens]
  const int32_t* slot_mapping;  // [num_tokens]
  const float* inv_freq;        // [rope_dim / 2]
  void* cache;                  // [num_blocks · block_size, latent_dim + rope_dim], cache_dtype
  DType cache_dtype = DType::kF32;
  float k_scale = 1.0f;
  int num_tokens, num_heads, latent_dim, rope_dim, q_stride, q_rope_offset;
  float eps = 1e-6f, rope_scale = 1.0f;
  bool rope_interleaved = false;
};

// Step 2: causal attention of every new token's heads over its sequence's cache rows.
struct MlaAttentionParams {
  const float* q_lat;  // [num_tokens, num_heads, latent_dim]
  const float* q_pe;   // [num_tokens, num_heads, rope_dim] (rotated: MlaPrepareParams::q_pe)
  const void* cache;   // as MlaPrepareParams::cache
  DType cache_dtype = DType::kF32;
  float* out;                   // [num_tokens, num_heads, latent_dim]
  const int32_t* query_start;   // [num_seqs + 1]
  const int32_t* context_lens;  // [num_seqs]
  const int32_t* block_tables;  // [num_seqs, max_blocks_per_seq]
  int num_seqs, max_blocks_per_seq, block_size;
  int num_heads, latent_dim, rope_dim;
  float scale;           // softmax scale, times k_scale for fp8 caches
  float v_scale = 1.0f;  // output multiplier: k_scale for fp8 caches (values are stored rows)
};

// out = silu(x[:, :inter]) * x[:, inter:]
struct SiluMulParams {
  const float* x;  // [rows, 2 * inter]
  float* out;      // [rows, inter]
  int rows, inter;
};

// out[r, :] += sigmoid(gate[r]) · x[r, :] (a gated shared expert's output added to the routed
// experts' sum, Qwen2-MoE).
struct SigmoidGateAddParams {
  const float* gate;  // [rows] (the gate linear's [rows, 1] output)
  const float* x;     // [rows, cols]
  float* out;         // [rows, cols]
  int rows, cols;
};

enum class RoutingMethod : uint8_t {
  kSoftmaxTopK,         // softmax over all experts, top-k, optionally renormalized
  kTopKSoftmax,         // top-k on logits, softmax over the k
  kSigmoidGroupedTopK,  // DeepSeek-V3: sigmoid, + bias for selection, group top-k
};

// Router: top-k experts and weights per token, fp32 math, ties to the lower expert index.
struct RouterParams {
  const float* logits;           // [num_tokens, num_experts]
  const float* correction_bias;  // [num_experts] or null (grouped method only)
  int32_t* topk_ids;             // [num_tokens, top_k]
  float* topk_weights;           // [num_tokens, top_k]
  int num_tokens, num_experts, top_k;
  RoutingMethod method;
  bool renormalize;  // kSoftmaxTopK / kSigmoidGroupedTopK: divide by the sum of the k weights
  int num_groups = 1, topk_groups = 1;  // grouped method
  float routed_scaling_factor = 1.0f;
};

}  // namespace serval::kernels
