// bf16-weight GEMM for few tokens (decode): y[m, n] = x[m, k] · W[n, k]ᵀ (+ bias), fp32
// accumulation, bf16 or f32 output. W stays in the checkpoint layout (row-major [n, k], no
// repacking). mma.sync m16n8k16 with swap-AB: 16 weight rows are the MMA M side, tokens the N side
// (all m ≤ kSmallMGemmMaxM tokens in one pass over the weights).
//
// Fragment trick: the dot product's k order is free, so within each 32-column chunk lane
// (g = lane / 4, t = lane % 4) loads 16 bytes = columns 8t..8t+7 of rows g and g+8 and the same 16
// bytes of token g's activations; word j of those loads (columns 8t+2j, 8t+2j+1) plays the role of
// k pair "t + 4·(j % 2)" of k16 step j / 2 in both the A and the B fragment. Products are paired
// with the same physical columns on both sides, so the sum is the ordinary dot product.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

#include "base/dtype.h"

namespace serval::kernels::cuda {

// Largest m the kernel handles (one token tile of 64). The backend's crossover to cuBLASLt is a
// separate, measured threshold.
constexpr int kSmallMGemmMaxM = 64;

struct SmallMGemmParams {
  const bf16* x;     // [m, k], 16-byte aligned (k % 8 == 0)
  const bf16* w;     // [n, k] row-major, 16-byte aligned
  const bf16* bias;  // [n] or null
  void* y;           // [m, n], bf16 or f32 (y_f32)
  bool y_f32;
  int m, n, k;
  void* workspace;  // small_m_gemm_workspace_bytes(m, n, k) bytes (may be 0 → null)
  size_t workspace_bytes;
};

// True when small_m_gemm can run this problem: 1 ≤ m ≤ kSmallMGemmMaxM, k % 8 == 0, x and w
// 16-byte aligned.
bool small_m_gemm_supported(const void* x, const void* w, int m, int k);

// Fp32 partial-sum workspace for split-K (0 when one split suffices).
size_t small_m_gemm_workspace_bytes(int m, int n, int k);

// m ≤ kBf16GemvMaxM runs bf16_gemv (bf16_gemv.h), larger m the mma kernel described above.
// Deterministic (fixed split-K reduction order). Launched with programmatic dependent launch: the
// first weight loads are issued before waiting for the previous kernel. Throws InvalidArgument if
// !small_m_gemm_supported or the workspace is too small.
void small_m_gemm(const SmallMGemmParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
