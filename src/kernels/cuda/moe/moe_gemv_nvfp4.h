// MoE experts for a few tokens (batch-1..4 decode) with NVFP4 weights in the repacked
// MMA-fragment layout (moe_nvfp4_repack.h), as two kernels:
//   gate_up: act[p, c] = silu(g) · u, g = x[t]·gate[e_p, c] · G, u = x[t]·up[e_p, c] · G, for every
//            (token, choice) pair p = t·top_k + j with a local expert e_p, c ∈ [0, inter)
//            (G = the expert's global scale; act rounded to bf16);
//   down:    out[t, h] = Σ_j topk_weights[t, j] · bf16(act[t·top_k + j]·down[e_j, h] · G_j),
//            j ascending, non-local choices skipped (fp32 sum, bf16 out): GEMM2 and the finalize
//            in one pass.
// Dequantization, unscaling and roundings are those of the grouped GEMM (moe_gemm.cu), so the two
// paths differ only in fp32 summation order. Only the top-k ids and weights of the routing are
// read, not its maps.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/dtype.h"
#include "kernels/cuda/moe/moe_routing.h"

namespace serval::kernels::cuda {

constexpr int kMoeGemvMaxTokens = 4;

struct MoeGemvNvfp4Params {
  const bf16* x;  // [num_tokens, hidden]
  // Repacked stacks of the local experts (moe_nvfp4_repack.h): gate_up has 2·inter rows (gate
  // [0, inter), up [inter, 2·inter)) × hidden columns, down hidden rows × inter columns.
  const uint8_t* gate_up_codes;
  const uint8_t* gate_up_scales;
  const float* gate_up_global;  // [num_local]
  const uint8_t* down_codes;
  const uint8_t* down_scales;
  const float* down_global;              // [num_local]
  const int32_t* topk_ids;               // [num_tokens, top_k] global expert ids
  const float* topk_weights;             // [num_tokens, top_k]
  bf16* act;                             // workspace [num_tokens · top_k, inter]
  bf16* out;                             // [num_tokens, hidden], fully written
  int num_tokens, top_k, hidden, inter;  // hidden and inter as stored (padded)
  int local_offset, num_local;           // this rank's experts
};

// Routing inside the GEMVs: every CTA routes its token from the router logits with the routing
// kernels' device code (so the same ids and weights), and topk_ids / topk_weights are not read.
// Saves the routing kernel, or the routing tail of the fused norm + router kernel
// (MoeNormRouterParams::logits_only), at one token.
struct MoeGemvRouting {
  const float* logits;      // [num_tokens, num_experts] fp32, written by an earlier kernel
  MoeRoutingParams params;  // method, sizes (num_tokens, top_k as the GEMVs'), local slice,
                            // scaling; its pointers are not used
};

// 1 ≤ num_tokens ≤ kMoeGemvMaxTokens , 1 ≤ top_k ≤ 8, hidden and inter multiples
// of 64, hidden ≤ 16384 and top_k · inter ≤ 12288 (activations staged in shared memory).
bool moe_gemv_nvfp4_supported(int num_tokens, int top_k, int hidden, int inter);

// Both kernels, programmatic dependent launch: gate_up waits for the routing kernel (with
// `route`: for the router's kernel, then routes); down reads the top-k ids (with `route`: routes
// from the logits), complete once every gate_up CTA has passed its wait, and requests its first
// weight tiles before waiting for gate_up. Throws InvalidArgument unless supported and the
// pointers are non-null and 16-byte aligned (with `route`: at most kMoeMaxExperts experts, its
// tokens and top_k those of p).
void moe_gemv_nvfp4(const MoeGemvNvfp4Params& p, cudaStream_t stream,
                    const MoeGemvRouting* route = nullptr);

}  // namespace serval::kernels::cuda
