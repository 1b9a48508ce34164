// Causal paged attention over a bf16 or fp8 (e4m3, e5m2) KV cache: a split-KV decode path and a
// flash-attention prefill path (tensor cores: wgmma at head_dim 128, mma.sync m16n8k16 otherwise),
// chosen on the host from max_query_len.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"

namespace serval::kernels::cuda {

// Same contract as the CPU kernels::PagedAttentionParams, on device pointers: sequence s has
// query rows [query_start[s], query_start[s+1]) at positions context_lens[s] − query_len + i,
// and its KV (already holding the new tokens) in blocks block_tables[s, ·].
// out = softmax(scale · q·k8ᵀ, causal) · v8 · v_scale over the stored cache values k8/v8, fp32
// accumulation, bf16 q and out. bf16 caches: mma in bf16. fp8 caches: K/V converted exactly to
// f16 and mma in f16 (q re-encoded bf16 → f16, saturating at ±65504; see attention_common.cuh).
// head_dim ∈ {16, 32, 64, 128} for bf16, {64, 128} for fp8; num_q_heads a multiple of
// num_kv_heads; both caches 16-byte aligned.
// The decode kernel's CTA: kAuto picks the 8-warp one for small grids (a few sequences: every
// (sequence, group of ≤ 16 q heads) pair can take 2 splits of one CTA per SM) and the 4-warp one
// otherwise (SERVAL_DECODE_WIDE=0: always the 4-warp one); kNarrow and kWide force one (tests;
// kWide needs head_dim ≥ 64 and at most 8192 pairs). Both give the same result up to fp32 summation
// order.
enum class DecodeCta { kAuto, kNarrow, kWide };

struct PagedAttentionParams {
  const bf16* q;                // [num_tokens, num_q_heads, head_dim]
  bf16* out;                    // [num_tokens, num_q_heads, head_dim]
  const void* k_cache;          // [num_blocks, block_size, num_kv_heads, head_dim], cache_dtype
  const void* v_cache;          // same
  const int32_t* query_start;   // [num_seqs + 1], device
  const int32_t* context_lens;  // [num_seqs], device
  const int32_t* block_tables;  // [num_seqs, max_blocks_per_seq], device
  int num_tokens, num_seqs, max_blocks_per_seq, block_size;
  int num_q_heads, num_kv_heads, head_dim;
  // Host-side bounds (not read from the device): max_query_len ≥ every query length (1 selects
  // the decode path: every sequence then has exactly one query row); max_context_len ≥ every
  // context length (sets the decode split count; pass a fixed bound, e.g. max_model_len, to
  // replay one CUDA graph for any lengths).
  int max_query_len, max_context_len;
  float scale;                       // softmax scale · k_scale (the caller folds k_scale in)
  float v_scale = 1.0f;              // applied to the output (the stored v is v / v_scale)
  DType cache_dtype = DType::kBF16;  // kBF16, kF8E4M3 or kF8E5M2 (both caches)
  void* workspace = nullptr;         // paged_attention_workspace_bytes(...) bytes, device, 16-B
                                     // aligned
  size_t workspace_bytes = 0;
  DecodeCta decode_cta = DecodeCta::kAuto;
};

// Decode split-KV partitions per (sequence, kv head), 1..64, chosen so the CTAs fill whole waves
// of the GPU (paged_attention.cu). Depends only on its arguments (and the device's SM count),
// never on the per-step context lengths, so graph replays agree. A sequence shorter than the
// bound uses only some of them (its context length and the grid's size pick how many, on the
// device).
int paged_attention_num_splits(int num_seqs, int num_q_heads, int num_kv_heads,
                               int max_context_len);

// Workspace for the decode merge: 0 when no split is needed or max_query_len > 1.
size_t paged_attention_workspace_bytes(int num_seqs, int num_q_heads, int num_kv_heads,
                                       int head_dim, int max_query_len, int max_context_len);

void paged_attention(const PagedAttentionParams& p, cudaStream_t stream);

// qk_norm_rope_kv(r) then paged_attention(p) for a decode step (p.max_query_len 1), in one kernel:
// the decode kernel takes q and the new key and value unprocessed from the fused QKV rows r.qkv
// (row = sequence), applies the q/k norm and RoPE itself, appends the key and value to the caches
// at r.slot_mapping and attends over them. Same output and cache bits as the two calls (q
// unwritten: r.q_out and p.q are not used). r names p's caches and cache dtype and shape. Each
// sequence's new key is its key context_lens[s] − 1, at position r.positions[s], and
// r.slot_mapping[s] must be that key's slot (< 0 only for padding: context 0).
struct QkNormRopeKvParams;
void paged_attention_rope(const PagedAttentionParams& p, const QkNormRopeKvParams& r,
                          cudaStream_t stream);

}  // namespace serval::kernels::cuda
