// MoE experts for a few tokens (batch-1..4 decode) with bf16 weights, as two GEMV kernels that
// read each needed expert row once as contiguous 512-byte runs (row_stream.cuh):
//   gate_up: act[p, c] = silu(x[t]·gate[e_p, c]) · (x[t]·up[e_p, c]) for every (token, choice)
//            pair p = t·top_k + j with a local expert e_p, c ∈ [0, inter);
//   down:    out[t, h] = Σ_j topk_weights[t, j] · bf16(act[t·top_k + j]·down[e_j, h]), j ascending,
//            non-local choices skipped (fp32 sum, bf16 out): GEMM2 and the finalize in one pass.
// Same roundings as the grouped-GEMM path (act and each expert's output rounded to bf16), so the
// two paths differ only in fp32 summation order. No routing maps are needed: only the top-k ids
// and weights.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/dtype.h"

namespace serval::kernels::cuda {

constexpr int kMoeGemvMaxTokens = 4;
constexpr int kMoeGemvMaxTopK = 8;

struct MoeGemvParams {
  const bf16* x;              // [num_tokens, hidden]
  const bf16* gate_up;        // [num_local, 2·inter, hidden]: rows [0, inter) gate, then up
  const bf16* down;           // [num_local, hidden, inter]
  const int32_t* topk_ids;    // [num_tokens, top_k] global expert ids
  const float* topk_weights;  // [num_tokens, top_k]
  bf16* act;                  // workspace [num_tokens · top_k, inter]
  bf16* out;                  // [num_tokens, hidden], fully written
  int num_tokens, top_k, hidden, inter;
  int local_offset, num_local;  // this rank's experts
};

// 1 ≤ num_tokens ≤ kMoeGemvMaxTokens, 1 ≤ top_k ≤ kMoeGemvMaxTopK, hidden and inter % 8 == 0.
bool moe_gemv_supported(int num_tokens, int top_k, int hidden, int inter);

// Both kernels, programmatic dependent launch; the first waits for the routing kernel.
// InvalidArgument unless moe_gemv_supported and the pointers are 16-byte aligned.
void moe_gemv(const MoeGemvParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
