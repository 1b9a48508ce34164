// A whole MoE block for ONE token with NVFP4 experts in one launch: the residual add + RMSNorm and
// router GEMV of moe_norm_router.h, the routing, gate_up + SwiGLU and down + the weighted combine
// of moe_gemv_nvfp4.h. At one token the block is a chain of dependent steps, each too small to
// fill the GPU: as three kernels (norm + router, gate_up with the routing in every CTA, down) it
// costs ~19 µs per Qwen3-30B layer on the H200 for ~21 MB of weights (~5 µs at 4.3 TB/s), mostly
// launch gaps, round trips and the gate_up CTAs' short instruction chains.
//
// One persistent grid of G CTAs of 16 warps, one per SM (G ≤ the SM count, all resident at once),
// with two grid-wide barriers on device-global arrival counters:
//   1. every CTA adds and normalizes the token's row itself (x, bit-identical to
//      moe_norm_router_topk's) and CTA c computes router rows [c·R, c·R + R) (the same fp32 sums);
//      barrier: all logits stored;
//   2. every CTA routes the token (routing::route_in_cta: the routing of every other path), then
//      takes its gate_up strips (16 channels of one choice: CTA c strips c, c + G, ...), their K
//      tiles split over its warps, and stores SwiGLU(act) as bf16; meanwhile it copies the down
//      tiles of its 16-row output strip (every local choice) into shared memory (cp.async);
//      barrier: all activations stored;
//   3. CTA c < hidden/16 multiplies its strip's down tiles with the staged activations, rounds
//      each choice's rows to bf16 and combines them in choice order in fp32 (down_body of
//      moe_gemv_nvfp4.cu with 16 warps: bit-identical for the same activations).
// The activations differ from the 3-kernel path's only in the fp32 summation order of gate_up's K
// partials. CTA 0 stores the new residual row (after barrier 1: every CTA has read the old one)
// and x. The next kernel may launch (PDL) once barrier 2 is passed, never before: its CTAs could
// otherwise take SMs this grid still needs.
#pragma once
#include <cuda_runtime_api.h>

#include "kernels/cuda/moe/moe_gemv_nvfp4.h"
#include "kernels/cuda/moe/moe_norm_router.h"

namespace serval::kernels::cuda {

struct MoeOneTokenNvfp4Params {
  // One token (routing.num_tokens == 1); logits required ([E] fp32 scratch, written); x written;
  // logits_only and the routing's output pointers are not used.
  MoeNormRouterParams norm_router;
  // num_tokens == 1, top_k as the routing's; x and topk_ids / topk_weights are not read; act is
  // scratch of top_k · inter bf16.
  MoeGemvNvfp4Params experts;
  // Null, or (benchmarks) [grid CTAs][kMoeOneTokenPhases] %globaltimer stamps in ns per CTA: at
  // its start, after the PDL wait, after barrier 1, after routing, before barrier 2, after it,
  // at its end.
  unsigned long long* phase_ns = nullptr;
};
inline constexpr int kMoeOneTokenPhases = 7;

// CTAs of the kernel's grid for p (the rows of phase_ns).
int moe_one_token_nvfp4_ctas(const MoeOneTokenNvfp4Params& p);

// Whether the fused kernel takes these shapes on the current device: one token, the shapes of
// moe_norm_router_supported and moe_gemv_nvfp4_supported, hidden ≤ 2048 with hidden / 16 ≤ the
// SM count (one down strip per CTA), top_k · inter / 16 gate_up strips within 4 per CTA, the
// router rows within 2 per CTA, the shared memory within the device's (the down tiles of a
// strip: top_k · inter · 9/16 bytes), and hidden / inter as the routing's.
bool moe_one_token_nvfp4_supported(const MoeOneTokenNvfp4Params& p);

// Throws InvalidArgument unless supported and the pointers are set and aligned (those of
// moe_norm_router_topk and moe_gemv_nvfp4). Launched with programmatic dependent launch (the
// router rows and the norm weight are read before waiting for the previous kernel). Uses
// device-global counters that the last CTA to finish resets: two launches must not run
// concurrently on one device (one stream per device, as moe_norm_router_topk).
void moe_one_token_nvfp4(const MoeOneTokenNvfp4Params& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
