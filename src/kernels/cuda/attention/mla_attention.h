// MLA (multi-head latent attention, DeepSeek-V2/V3) in its absorbed form on a bf16 or fp8 paged
// cache of latent rows: the pre-processing (cache rows and rotated query rope parts) and causal
// paged attention over the rows, in CUDA cores with fp32 softmax and accumulation.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"

namespace serval::kernels::cuda {

// kernels::MlaPrepareParams on device pointers, bf16 activations: for every token t, the cache
// row at slot_mapping[t] (skipped when < 0) becomes [RMSNorm(kv[t, :L]) · kv_norm, rotated
// kv[t, L:]] / k_scale in cache_dtype, and q_pe[t, h] the rotated q[t, h·q_stride + q_rope_offset
// + (0..R)]. Rotation as MlaPrepareParams states (neox or interleaved input pairs, neox-order
// output, × rope_scale); angles positions[t] · inv_freq[i] in fp32 with sincosf. The norm sums
// squares in fp32; products are rounded to fp32 before the cast to the cache (bf16 round to
// nearest even, fp8 round to nearest even with saturation to the largest finite value, as the
// CPU's float_to_e4m3 / float_to_e5m2). kv_norm and inv_freq are weights (read before the
// programmatic-dependent-launch wait).
// latent_dim even, rope_dim even and ≤ 64, q_rope_offset + rope_dim ≤ q_stride.
struct MlaPrepareParams {
  const bf16* q;                // [num_tokens, num_heads · q_stride]
  const bf16* kv;               // [num_tokens, latent_dim + rope_dim]
  const bf16* kv_norm;          // [latent_dim]
  const int32_t* positions;     // [num_tokens]
  const int32_t* slot_mapping;  // [num_tokens]: block · block_size + offset, < 0 = skip
  const float* inv_freq;        // [rope_dim / 2]
  bf16* q_pe;                   // out [num_tokens, num_heads, rope_dim], bf16 (round to nearest)
  void* cache;                  // [num_blocks · block_size, latent_dim + rope_dim], cache_dtype
  DType cache_dtype = DType::kBF16;  // kBF16, kF8E4M3 or kF8E5M2
  float k_scale = 1.0f;              // positive and finite
  int num_tokens, num_heads, latent_dim, rope_dim, q_stride, q_rope_offset;
  float eps = 1e-6f, rope_scale = 1.0f;
  bool rope_interleaved = false;
};

void mla_prepare(const MlaPrepareParams& p, cudaStream_t stream);

// kernels::MlaAttentionParams on device pointers: token t of sequence s (query rows
// [query_start[s], query_start[s+1])) sits at position context_lens[s] − query_len + i and attends
// to its sequence's rows 0..position (block_tables[s, ·]); head h scores row j as (q_lat[t, h] ·
// c_j + q_pe[t, h] · k_pe_j) · scale over the stored values, and out[t, h] = Σ_j p_j · c_j ·
// v_scale (fp32 softmax and accumulation, bf16 out). Tokens at or past query_start[num_seqs]
// get zeros. num_tokens may exceed query_start[num_seqs] but not the rows of q_lat, q_pe, out.
// latent_dim even and ≤ 512, rope_dim even and ≤ 64; q_lat, q_pe 4-byte aligned, the cache
// 16-byte aligned; fp8 caches need (latent_dim + rope_dim) % 4 == 0.
// A grid with few CTAs (decode) splits each token's keys over up to 32 CTAs and merges their
// partial softmaxes in a second kernel, through `workspace`.
struct MlaAttentionParams {
  const bf16* q_lat;  // [num_tokens, num_heads, latent_dim]
  const bf16* q_pe;   // [num_tokens, num_heads, rope_dim] (MlaPrepareParams::q_pe)
  const void* cache;  // [num_blocks · block_size, latent_dim + rope_dim], cache_dtype
  DType cache_dtype = DType::kBF16;  // kBF16, kF8E4M3 or kF8E5M2
  bf16* out;                         // [num_tokens, num_heads, latent_dim]
  const int32_t* query_start;        // [num_seqs + 1], device
  const int32_t* context_lens;       // [num_seqs], device
  const int32_t* block_tables;       // [num_seqs, max_blocks_per_seq], device
  int num_tokens, num_seqs, max_blocks_per_seq, block_size;
  int num_heads, latent_dim, rope_dim;
  // Host-side bound ≥ every context length (sets the split count: pass a fixed bound, e.g.
  // max_model_len, to replay one CUDA graph for any lengths).
  int max_context_len;
  float scale;           // softmax scale · k_scale (the caller folds k_scale in)
  float v_scale = 1.0f;  // output multiplier: k_scale for fp8 caches (the values are stored rows)
  void* workspace = nullptr;  // mla_attention_workspace_bytes(...) bytes, device, 16-B aligned
  size_t workspace_bytes = 0;
};

// Key splits per (token, head group), 1..32: more than 1 only when the grid has fewer CTAs than
// fill the GPU and the context bound is long. Depends on its arguments (and the device's SM count)
// only, so graph replays agree.
int mla_attention_num_splits(int num_tokens, int num_heads, int max_context_len);

// Workspace of mla_attention: 0 when mla_attention_num_splits is 1.
size_t mla_attention_workspace_bytes(int num_tokens, int num_heads, int latent_dim,
                                     int max_context_len);

void mla_attention(const MlaAttentionParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
