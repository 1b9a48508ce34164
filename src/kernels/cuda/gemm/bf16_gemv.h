// bf16-weight GEMV for 1–4 tokens (decode): y[m, n] = x[m, k] · W[n, k]ᵀ (+ bias), fp32
// accumulation in CUDA cores, bf16 or f32 output. W stays in the checkpoint layout (row-major
// [n, k], no repacking).
//
// Each warp streams whole weight rows as 512-byte contiguous runs per load instruction (DRAM pages
// read front to back) through a register ring that runs on from one row pair into the next, so a
// warp that owns several row pairs never waits a full memory latency between them. Measured on
// the H200 with graph-timed launches over cold weights (bench/RESULTS.md): at m = 1 on par with or
// faster than cuBLASLt up to 64 MB of weights (3.3× on 4 MB); from m = 2 cuBLASLt wins except on
// the smallest matrices, so the CUDA backend uses this kernel only there.
#pragma once
#include <cuda_runtime_api.h>

#include "base/dtype.h"

namespace serval::kernels::cuda {

constexpr int kBf16GemvMaxM = 4;

struct Bf16GemvParams {
  const bf16* x;     // [m, k], 16-byte aligned (k % 8 == 0)
  const bf16* w;     // [n, k] row-major, 16-byte aligned
  const bf16* bias;  // [n] or null
  void* y;           // [m, n], bf16 or f32 (y_f32)
  bool y_f32;
  int m, n, k;
};

// 1 ≤ m ≤ kBf16GemvMaxM, k > 0, k % 8 == 0, x and w 16-byte aligned.
bool bf16_gemv_supported(const void* x, const void* w, int m, int k);

// Deterministic (each output is one warp's fixed-order sum). Launched with programmatic dependent
// launch: the first weight loads are issued before waiting for the previous kernel. Throws
// InvalidArgument unless bf16_gemv_supported and n > 0.
void bf16_gemv(const Bf16GemvParams& p, cudaStream_t stream);

// The same product on bulk copies (bf16_gemv_bulk.cu): each of ctas_per_sm · SMs CTAs streams a
// contiguous span of whole rows through shared memory (cp.async.bulk, 16 KB stages, four in
// flight, the first four requested before the PDL wait), so a few hundred instructions per CTA
// move ~16 MB where the register-streaming kernel needs a load per 16 bytes. Deterministic.
// Needs bf16_gemv_supported, k % 256 == 0 and k ≤ 8192; throws InvalidArgument otherwise.
bool bf16_gemv_bulk_supported(const void* x, const void* w, int m, int k);
void bf16_gemv_bulk(const Bf16GemvParams& p, int ctas_per_sm, cudaStream_t stream);

}  // namespace serval::kernels::cuda
