// Small bf16 kernels: SiLU-and-mul, row gathers (embedding, logits rows), add, bf16→f32 cast.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/dtype.h"

namespace serval::kernels::cuda {

// out[r, i] = silu(x[r, i]) · x[r, inter + i], fp32 math.
struct SiluMulParams {
  const bf16* x;  // [rows, 2·inter]
  bf16* out;      // [rows, inter]
  int rows, inter;
};
void silu_mul(const SiluMulParams& p, cudaStream_t stream);

// out[i] = src[rows[i]] for i < num_rows. Row indices are trusted (the host validates token
// ids against the vocabulary before upload). Serves the embedding lookup and logits gathers.
struct GatherRowsParams {
  const bf16* src;      // [num_src_rows, cols]
  const int32_t* rows;  // [num_rows]
  bf16* out;            // [num_rows, cols]
  int num_rows, cols;
};
void gather_rows(const GatherRowsParams& p, cudaStream_t stream);

// out[t] = table[ids[t]]: gather_rows on the embedding table.
struct EmbeddingParams {
  const bf16* table;   // [vocab, hidden]
  const int32_t* ids;  // [num_tokens], each in [0, vocab)
  bf16* out;           // [num_tokens, hidden]
  int num_tokens, hidden;
};
void embedding(const EmbeddingParams& p, cudaStream_t stream);

// out = bf16(a + b) element-wise, fp32 sum; out may alias a or b.
struct AddParams {
  const bf16* a;  // [n]
  const bf16* b;  // [n]
  bf16* out;      // [n]
  int64_t n;
};
void add(const AddParams& p, cudaStream_t stream);

struct CastBf16ToF32Params {
  const bf16* src;  // [n]
  float* dst;       // [n]
  int64_t n;
};
void cast_bf16_to_f32(const CastBf16ToF32Params& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
