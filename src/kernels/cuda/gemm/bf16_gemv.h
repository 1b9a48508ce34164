// bf16-weight GEMV for 1–4 tokens (batch-1 decode): y[m, n] = x[m, k] · W[n, k]ᵀ (+ bias), fp32
// accumulation in CUDA cores, bf16 or f32 output. Reached through small_m_gemm, which uses it for
// m ≤ kBf16GemvMaxM (the mma.sync kernel takes larger m).
//
// Why a second kernel: the mma kernel's lanes read 16-row × 64-byte tiles, so a warp touches 16
// rows 4 KB apart per load; at one token the step is bound by DRAM efficiency, and this kernel's
// warps read 2 whole rows as 512-byte contiguous runs per load instruction (one DRAM page after
// another), with every weight byte of a row in flight at once for k ≤ 2048.
#pragma once
#include <cuda_runtime_api.h>

#include "kernels/cuda/gemm/small_m_gemm.h"

namespace serval::kernels::cuda {

constexpr int kBf16GemvMaxM = 4;

// Preconditions (checked by small_m_gemm): 1 ≤ m ≤ kBf16GemvMaxM, n > 0, k % 8 == 0, x and w
// 16-byte aligned. No workspace. Launched with programmatic dependent launch: the first weight
// loads are issued before waiting for the previous kernel.
void bf16_gemv(const SmallMGemmParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
