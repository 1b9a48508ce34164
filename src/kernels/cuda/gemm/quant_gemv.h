// Decode path of quant_gemm (quant_gemm.h) for 1 ≤ m ≤ kQuantGemvMaxM tokens: the same weights
// (fragment layout), the same dequantization (bit-identical dequantized values) and the same
// epilogue (alpha, FP8 row scale, bias, bf16 or f32 out); results differ from the mma kernel only
// in fp32 summation order. quant_gemm() dispatches here when quant_gemv_supported(); the mma
// kernel stays callable as quant_gemm_mma for tests and benchmarks.
#pragma once
#include <cuda_runtime_api.h>

#include "kernels/cuda/gemm/quant_gemm.h"

namespace serval::kernels::cuda {

constexpr int kQuantGemvMaxM = 16;  // two blocks of the eight columns of the MMA B side

// 1 ≤ m ≤ kQuantGemvMaxM, k % 8 == 0, scales 4-byte aligned, and for FP8 block
// block_n % 32 == 0 and block_k % 64 == 0 (one multiplier per 32 × 64 tile). Other formats and
// shapes stay on the mma kernel. The SwiGLU epilogue (p.swiglu) also needs n % 32 == 0, no bias
// and a bf16 y. Assumes p.w passed quant_gemm's validation.
bool quant_gemv_supported(const QuantGemmParams& p);

// y = x · dequant(W)ᵀ (+ bias); needs no caller workspace. Throws InvalidArgument unless supported
// and w.data 16-byte / x 4-byte aligned. Programmatic dependent launch; deterministic (the same
// bits for the same inputs, shape and device; graph replays included).
// K splits of one row tile may run in different CTAs and merge through a fixed device-global
// workspace (partial sums and self-resetting arrival counters, quant_gemv.cu), so at most ONE
// quant_gemv (or quant_gemm at m ≤ 16) may run at a time per device: calls in one stream are fine
// (with PDL the next launch touches the workspace only after its pdl_wait, when this grid has
// completed); calls on two streams of one device must not overlap.
void quant_gemv(const QuantGemmParams& p, cudaStream_t stream);

// quant_gemm's mma kernel for any m ≥ 0 (defined in quant_gemm.cu): the reference the tests
// compare the decode path with, and the "old" column of the benchmark.
void quant_gemm_mma(const QuantGemmParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
