// Internal: the two attention paths behind paged_attention(); shared by the .cu files only.
#pragma once
#include "kernels/cuda/attention/paged_attention.h"

namespace serval::kernels::cuda {

// Decode split-KV partition: keys per split for a sequence of `ctx` keys cut into `num_splits`
// parts, rounded up to whole 64-key tiles (attn::kTileKeys); split i covers keys
// [i·chunk, min(ctx, (i+1)·chunk)), so trailing splits may be empty.
constexpr int kDecodeTileKeys = 64;
__host__ __device__ constexpr int decode_chunk_keys(int ctx, int num_splits) {
  return ((ctx + num_splits - 1) / num_splits + kDecodeTileKeys - 1) / kDecodeTileKeys *
         kDecodeTileKeys;
}

// Every query_len == 1. o_part/lse_part: [num_seqs, Hq, num_splits, D] / [num_seqs, Hq,
// num_splits] fp32, used (and then merged) only when num_splits > 1.
void paged_attention_decode(const PagedAttentionParams& p, int num_splits, float* o_part,
                            float* lse_part, cudaStream_t stream);

// Any query lengths (prefill, chunked prefill, mixed batches).
void paged_attention_prefill(const PagedAttentionParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
