// The throughput backend's bf16 grouped GEMMs on wgmma (moe_gemm_wgmma.cu), behind
// moe_grouped_gemm.
#pragma once
#include <cuda_runtime_api.h>

#include "kernels/cuda/moe/moe_gemm.h"

namespace serval::kernels::cuda {

// Runs `p` (already validated by moe_grouped_gemm) on the wgmma kernels and returns true when
// they take it: throughput config, 128-token tiles, SERVAL_MOE_GEMM_MMA_SYNC unset, bf16 weights
// or NVFP4 ones (moe_grouped_gemm_wgmma_nvfp4).
bool moe_grouped_gemm_wgmma(const MoeGemmParams& p, cudaStream_t stream);

// The warp-specialized kernel (moe_gemm_wgmma_ws.cu, 256 weight rows per CTA) for `p` when the
// output divides into its tiles (GEMM1 inter % 128, GEMM2 hidden % 256): launches it and
// returns true. Called by moe_grouped_gemm_wgmma unless SERVAL_MOE_WGMMA_WS=0.
bool moe_grouped_gemm_wgmma_ws(const MoeGemmParams& p, cudaStream_t stream);

// NVFP4 experts (moe_gemm_wgmma_nvfp4.cu: 128 weight rows × 128 tokens per CTA, dequantized in
// registers) for `p` unless SERVAL_MOE_NVFP4_WGMMA=0 (then the mma.sync kernel): launches it and
// returns true.
bool moe_grouped_gemm_wgmma_nvfp4(const MoeGemmParams& p, cudaStream_t stream);

// Whether the persistent kernels run tiles with at most 32 or 64 tokens (an expert's last) as
// narrower wgmma (moe_wgmma::tile_width): when `p` has the row map, unless
// SERVAL_MOE_NARROW_TILES=0 (comparisons).
bool moe_narrow_tiles(const MoeGemmParams& p);

}  // namespace serval::kernels::cuda
