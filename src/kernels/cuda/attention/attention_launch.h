// Internal: the two attention paths behind paged_attention(); shared by the .cu files only.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "base/error.h"
#include "kernels/cuda/attention/paged_attention.h"

namespace serval::kernels::cuda {

// Decode split-KV partition. The launch has `num_splits` CTAs per (sequence, head group), fixed by
// the host bounds (paged_attention_num_splits); how many of them a sequence uses depends on its
// own context length, read on the device, and on the grid's size (decode_partition), so a graph
// replay agrees with an eager run of the same (padded) batch.
constexpr int kDecodeTileKeys = 64;  // keys per shared-memory tile of a decode CTA
constexpr int kDecodeMaxSplits = 64;
// Decode CTAs resident per SM at head_dim 128 (paged_decode.cu sizes its shared memory and
// registers for it).
constexpr int kDecodeCtasPerSm = 3;

// Split-choice cost model (host and device), in units of one 64-key tile streamed by one CTA: a
// CTA's fixed cost (launch, metadata, q, first-tile latency, epilogue) and the merge's fixed cost
// (arrival, one L2 round trip). The CTAs run in waves of `slots` = SMs · resident CTAs per SM.
// Fitted on an H200 (Qwen3 shape, batch 64, 1024 keys): 1 split of 16 tiles in one wave 31.1 µs,
// 3 splits of 6 tiles in two waves 37.1 µs, i.e. (16 + F)·u and (2·(6 + F) + 2)·u with F ≈ 6.
constexpr int kCtaFixedTiles = 6;
constexpr int kMergeTiles = 2;

#ifdef __CUDACC__
// A sequence of `ctx` keys (T64 = ⌈ctx / 64⌉ tiles; below, tiles of kTileKeys keys, 64 for the
// usual 4-warp CTA and 128 for the wide one of paged_decode.cu) served by CTAs of `rows` q heads:
// each active split streams `chunk_keys` = tiles_per_split · 64 keys, split i covering keys
// [i·chunk_keys, min(ctx, (i+1)·chunk_keys)); splits ≥ `active` have no key and do nothing.
// tiles_per_split = max(⌈T64 / num_splits⌉, ⌊√(T64 · rows / 64)⌋): the second term balances
// streaming against the merge, whose last CTA reads rows·D fp32 per split (1/64 of a tile per
// row): T + T64·rows/(64·T) is least at T = √(T64·rows/64). Short contexts (T64 ≤ num_splits
// and T64·rows < 256) get one tile per split. ctx ≤ 0: no active split.
// The host sized num_splits for its context bound; when this sequence's splits, taken by all
// `pairs` (sequence, head group) pairs of the grid, need more than one wave of `slots` CTAs, the
// most splits that fit one wave are taken instead if the cost model finds them no slower (e.g.
// batch 64, 4 KV heads, 1024 keys under a 40960 bound: 1 split of 16 tiles instead of 3 of 6 in
// two waves). Every split then takes at least min_tiles tiles (paged_decode.cu's
// decode_min_tiles), fewer splits if need be.
struct DecodePartition {
  int chunk_keys, active;
};
template <int kTileKeys = kDecodeTileKeys>
__device__ __forceinline__ DecodePartition decode_partition(int ctx, int num_splits, int rows,
                                                            int pairs, int slots, int min_tiles) {
  if (ctx <= 0) return {kTileKeys, 0};
  const int tiles = (ctx + kTileKeys - 1) / kTileKeys;
  const int balanced = max(int(sqrtf(float(tiles) * float(rows) * (1.0f / kTileKeys))), 1);
  int per_split = max((tiles + num_splits - 1) / num_splits, balanced);
  const int splits = (tiles + per_split - 1) / per_split;
  const int wave_splits = max(slots / max(pairs, 1), 1);
  if (splits > wave_splits) {
    const int waves = (splits * pairs + slots - 1) / slots;
    const int cost = waves * (per_split + kCtaFixedTiles) + kMergeTiles;
    const int one_wave = max((tiles + wave_splits - 1) / wave_splits, balanced);
    const int one_wave_cost = one_wave + kCtaFixedTiles + (one_wave < tiles ? kMergeTiles : 0);
    if (one_wave_cost <= cost) per_split = one_wave;
  }
  per_split = max(per_split, min_tiles);
  return {per_split * kTileKeys, (tiles + per_split - 1) / per_split};
}
#endif

// What the decode kernel needs to do qk_norm_rope_kv's work itself (paged_attention_rope): the
// step's fused QKV rows (row = sequence) and that kernel's parameters, the scales as reciprocals
// (taken on the host, as qk_norm_rope_kv does). The caches are paged_attention's, writable.
struct DecodeRopeArgs {
  const bf16* qkv = nullptr;  // [num_seqs, (Hq + 2·Hkv)·D]
  const bf16* q_norm = nullptr;
  const bf16* k_norm = nullptr;
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  const int32_t* slot_mapping = nullptr;
  unsigned char* k_cache = nullptr;
  unsigned char* v_cache = nullptr;
  float eps = 0.0f, inv_k_scale = 1.0f, inv_v_scale = 1.0f;
};

// Every query_len == 1. o_part/lse_part: [num_seqs, Hq, num_splits, D] / [num_seqs, Hq,
// num_splits] fp32, used (and then merged) only by sequences with more than one active split.
// rope_args: null, or the fused q/k norm, RoPE and KV append (p.q unused).
void paged_attention_decode(const PagedAttentionParams& p, int num_splits, float* o_part,
                            float* lse_part, const DecodeRopeArgs* rope_args, cudaStream_t stream);

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

// The wgmma prefill (paged_prefill_wgmma.cu) when it takes these parameters (head_dim 128; a bf16
// cache with v_scale 1, or an fp8 cache; SERVAL_PREFILL_MMA_SYNC unset): launches it and returns
// true; false otherwise.
bool paged_attention_prefill_wgmma(const PagedAttentionParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
