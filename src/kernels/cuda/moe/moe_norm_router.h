// The first stages of an MoE block for a few tokens in ONE launch: residual add + RMSNorm (the
// post-attention norm), the router GEMV (bf16 weights, fp32 logits) and the few-token routing of
// moe_routing (top-k and the expert tile maps). Unfused, these are three dependent kernels of
// ~4–6 µs each in a batch-1 decode step; most of that is launch and round-trip latency.
#pragma once
#include <cuda_runtime_api.h>

#include "base/dtype.h"
#include "kernels/cuda/moe/moe_routing.h"

namespace serval::kernels::cuda {

// Most tokens the fused kernel takes (the few-token routing body: one warp per token).
inline constexpr int kMoeNormRouterMaxTokens = 8;

// With T = routing.num_tokens, H = hidden, E = routing.num_experts:
//   residual ← bf16(residual + h)                       (in place; fp32 sum, as rms_norm)
//   x        ← rms_norm(residual) · norm_weight         bit-identical to kernels::cuda::rms_norm
//                                                       with a residual (sum of squares over the
//                                                       unrounded fp32 sums, scaling of the
//                                                       bf16-rounded residual)
//   logits   ← x · routerᵀ                              [T, E] fp32: fp32 products of the bf16 x
//                                                       and weights, summed in a fixed order that
//                                                       differs from bf16_gemv / cuBLASLt (per
//                                                       thread over its 8-column chunks in column
//                                                       order, then a warp butterfly, then the 8
//                                                       warps in order): ~1e-6 relative apart
//   routing outputs as moe_routing for T ≤ 8 (the same device code), from these logits.
// routing.logits is ignored (the kernel reads `logits`). Deterministic: graph replays equal
// eager runs bit for bit. `h` may not alias residual, x or logits; x may not alias residual.
struct MoeNormRouterParams {
  const bf16* h;            // [T, H]: the block's output (attention o_proj) added to the residual
  bf16* residual;           // [T, H], updated in place
  const bf16* norm_weight;  // [H]
  const bf16* router;       // [E, H] row-major (no bias)
  bf16* x;                  // [T, H] out: the normed rows (the experts' input)
  float* logits;            // [T, E] out
  int hidden = 0;
  float eps = 1e-6f;
  MoeRoutingParams routing;  // sizes, method, local slice, tile and the routing outputs
  // Set: the last CTA stores the residual and ends (no routing: its outputs are not written);
  // the consumer routes from the logits itself (kernels/cuda/moe/moe_gemv_nvfp4.h).
  bool logits_only = false;
};

// Whether the fused kernel takes these shapes: 1 ≤ T ≤ kMoeNormRouterMaxTokens,
// hidden % 8 == 0 and ≤ 8192, E ≤ kMoeMaxExperts, top_k ≤ kMoeMaxTopK, num_local ≤ kMoeMaxExperts,
// and h, residual, norm_weight, router, x 16-byte aligned (the output pointers are not looked at:
// the backend asks before it allocates them).
bool moe_norm_router_supported(const MoeNormRouterParams& p);

// Throws InvalidArgument unless moe_norm_router_supported, logits is set and moe_routing's own
// checks pass.
// Launched with programmatic dependent launch: the router and norm weights are requested before
// waiting for the previous kernel. Uses a device-global arrival counter that the last CTA resets:
// two launches must not run concurrently on one device (one stream per device, as argmax).
void moe_norm_router_topk(const MoeNormRouterParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
