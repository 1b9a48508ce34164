// Internal: the two attention paths behind paged_attention(); shared by the .cu files only.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "base/error.h"
#include "kernels/cuda/attention/paged_attention.h"

namespace serval::kernels::cuda {

// Decode split-KV partition. The launch has `num_splits` CTAs per (sequence, head group), fixed by
// the host bounds (paged_attention_num_splits); how many of them a sequence uses depends on its
// own context length, read on the device, so graph replays and eager runs still agree.
constexpr int kDecodeTileKeys = 64;  // keys per shared-memory tile of a decode CTA
constexpr int kDecodeMaxSplits = 64;

#ifdef __CUDACC__
// A sequence of `ctx` keys (T64 = ⌈ctx / 64⌉ tiles) served by CTAs of `rows` q heads: each active
// split streams `chunk_keys` = tiles_per_split · 64 keys, split i covering keys
// [i·chunk_keys, min(ctx, (i+1)·chunk_keys)); splits ≥ `active` have no key and do nothing.
// tiles_per_split = max(⌈T64 / num_splits⌉, ⌊√(T64 · rows / 64)⌋): the second term balances
// streaming against the merge, whose last CTA reads rows·D fp32 per split (1/64 of a tile per
// row): T + T64·rows/(64·T) is least at T = √(T64·rows/64). Short contexts (T64 ≤ num_splits
// and T64·rows < 256) get one tile per split. ctx ≤ 0: no active split.
struct DecodePartition {
  int chunk_keys, active;
};
__device__ __forceinline__ DecodePartition decode_partition(int ctx, int num_splits, int rows) {
  if (ctx <= 0) return {kDecodeTileKeys, 0};
  const int tiles = (ctx + kDecodeTileKeys - 1) / kDecodeTileKeys;
  const int balanced = int(sqrtf(float(tiles) * float(rows) * (1.0f / kDecodeTileKeys)));
  const int per_split = max(max((tiles + num_splits - 1) / num_splits, balanced), 1);
  return {per_split * kDecodeTileKeys, (tiles + per_split - 1) / per_split};
}
#endif

// Every query_len == 1. o_part/lse_part: [num_seqs, Hq, num_splits, D] / [num_seqs, Hq,
// num_splits] fp32, used (and then merged) only by sequences with more than one active split.
void paged_attention_decode(const PagedAttentionParams& p, int num_splits, float* o_part,
                            float* lse_part, cudaStream_t stream);

// log2 of the q heads one prefill CTA takes (both prefill kernels): the largest power of two
// ≤ 8 dividing the GQA group, so the CTA's heads share one KV head.
inline int prefill_log_heads_per_cta(int num_q_heads, int num_kv_heads) {
  const int group = num_q_heads / num_kv_heads;
  int log_hpc = 0;
  while (log_hpc < 3 && group % (2 << log_hpc) == 0) ++log_hpc;
  return log_hpc;
}

// The prefill grid (q head groups, sequences, query tiles) for CTAs of `cta_rows` (query row,
// q head) pairs of 2^log_hpc q heads; InvalidArgument when it exceeds CUDA's grid limits.
inline dim3 prefill_grid(const PagedAttentionParams& p, int log_hpc, int cta_rows) {
  const int positions = cta_rows >> log_hpc;
  const int64_t q_tiles = (int64_t(p.max_query_len) + positions - 1) / positions;
  if (p.num_seqs > 65535 || q_tiles > 65535) {
    throw InvalidArgument("paged_attention: prefill grid too large (" + std::to_string(p.num_seqs) +
                          " sequences, max_query_len " + std::to_string(p.max_query_len) + ")");
  }
  return dim3(unsigned(p.num_q_heads >> log_hpc), unsigned(p.num_seqs), unsigned(q_tiles));
}

// Any query lengths (prefill, chunked prefill, mixed batches).
void paged_attention_prefill(const PagedAttentionParams& p, cudaStream_t stream);

// The wgmma prefill (paged_prefill_wgmma.cu) when it takes these parameters (bf16 cache,
// head_dim 128, SERVAL_PREFILL_MMA_SYNC unset): launches it and returns true; false otherwise.
bool paged_attention_prefill_wgmma(const PagedAttentionParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
