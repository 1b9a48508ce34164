// The throughput backend's bf16 grouped GEMMs on wgmma (moe_gemm_wgmma.cu), behind
// moe_grouped_gemm.
#pragma once
#include <cuda_runtime_api.h>

#include "kernels/cuda/moe/moe_gemm.h"

namespace serval::kernels::cuda {

// Runs `p` (already validated by moe_grouped_gemm) on the wgmma kernels and returns true when
// they take it: throughput config, bf16 weights, 128-token tiles, SERVAL_MOE_GEMM_MMA_SYNC unset.
bool moe_grouped_gemm_wgmma(const MoeGemmParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
