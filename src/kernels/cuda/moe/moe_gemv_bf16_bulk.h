// MoE experts for one or two tokens with bf16 weights, on bulk copies (the latency backend's
// decode path; kernels/cuda/gemm/bulk_stage.cuh), as two kernels with the semantics of the grouped
// GEMMs plus finalize (moe_gemm.h), so the paths differ only in fp32 summation order:
//   gate_up: act[p, c] = bf16(silu(g) · u), g = x[t]·gate[e_p, c], u = x[t]·up[e_p, c], for every
//            (token, choice) pair p = t·top_k + j with a local expert e_p, c ∈ [0, inter);
//   down:    out[t, h] = bf16(Σ_j topk_weights[t, j] · bf16(act[t·top_k + j]·down[e_j, h])),
//            j ascending, non-local choices skipped.
// A gate_up CTA streams the gate and up rows of a span of channels of its pair's expert, a down
// CTA the rows of a span of hidden units of each of its token's experts in turn; only the top-k
// ids and weights of the routing are read.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/dtype.h"

namespace serval::kernels::cuda {

constexpr int kMoeBf16BulkMaxTokens = 2;

struct MoeBf16BulkParams {
  const bf16* x;              // [num_tokens, hidden]
  const bf16* gate_up;        // [num_local, 2·inter, hidden]: gate rows, then up rows
  const bf16* down;           // [num_local, hidden, inter]
  const int32_t* topk_ids;    // [num_tokens, top_k] global expert ids
  const float* topk_weights;  // [num_tokens, top_k]
  bf16* act;                  // workspace [num_tokens · top_k, inter]
  bf16* out;                  // [num_tokens, hidden], fully written
  int num_tokens, top_k, hidden, inter;
  int local_offset, num_local;  // this rank's experts
};

// 1 ≤ num_tokens ≤ 2, 1 ≤ top_k ≤ 8, hidden and inter multiples of 256, hidden ≤ 4096 (a stage
// holds a gate and an up row), inter ≤ 8192 and top_k · inter ≤ 12288 (the down kernel stages a
// token's activations in shared memory).
bool moe_bf16_bulk_supported(int num_tokens, int top_k, int hidden, int inter);

// Both kernels, programmatic dependent launch (gate_up waits for the routing before it reads the
// ids; down for gate_up). Throws InvalidArgument unless supported and every pointer is non-null
// and 16-byte aligned.
void moe_bf16_bulk(const MoeBf16BulkParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
