// bf16 GEMV for 1–4 tokens (see bf16_gemv.h). Warp = kRows consecutive weight rows over all of k,
// streamed by RowStream (row_stream.cuh) with the first two stages requested before the PDL wait;
// each lane keeps fp32 sums per (token, row), reduced across the warp with shuffles at the end.
// No split-K: every output is one warp's, so the summation order is fixed (deterministic, graph
// replays equal eager runs).
#include "kernels/cuda/gemm/bf16_gemv.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/gemm/row_stream.cuh"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"

namespace serval::kernels::cuda {

namespace {

constexpr int kWarps = 4;    // warps per CTA: small CTAs spread small matrices over more SMs
constexpr int kRows = 2;     // weight rows per warp
constexpr int kSlices = 4;   // 256-column slices per stage (1024 columns)
constexpr int kMinCtas = 4;  // ≤ 128 registers: 16 warps per SM, 8 KB of weights in flight each

__device__ __forceinline__ void store_out(const SmallMGemmParams& p, int tok, int row, float v) {
  if (p.bias) v += __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p.bias)[row]);
  const size_t i = size_t(tok) * p.n + row;
  if (p.y_f32) {
    static_cast<float*>(p.y)[i] = v;
  } else {
    static_cast<__nv_bfloat16*>(p.y)[i] = __float2bfloat16_rn(v);
  }
}

// Grid ceil(n / (kRows·kWarps)); M ≥ p.m tokens (tokens ≥ m repeat token m − 1, never stored).
template <int M>
__global__ void __launch_bounds__(kWarps * 32, kMinCtas) bf16_gemv_kernel(SmallMGemmParams p) {
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * kWarps + (threadIdx.x >> 5)) * kRows;
  const bool active = row0 < p.n;
  const __nv_bfloat16* wb = reinterpret_cast<const __nv_bfloat16*>(p.w);
  const __nv_bfloat16* rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) rows[r] = wb + size_t(min(row0 + r, p.n - 1)) * p.k;
  RowStream<kRows, kSlices> stream;
  if (active) stream.start(rows, p.k, lane);
  pdl_wait();
  if (!active) return;  // no barriers in this kernel

  const __nv_bfloat16* xb = reinterpret_cast<const __nv_bfloat16*>(p.x);
  float acc[M][kRows] = {};
  stream.accumulate<M, false>([&](int t, int) { return xb + size_t(min(t, p.m - 1)) * p.k; }, acc);

  // Every lane ends with every total; lane t·kRows + r stores (token t, row row0 + r).
#pragma unroll
  for (int t = 0; t < M; ++t)
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float v = warp_sum(acc[t][r]);
      if (lane == t * kRows + r && t < p.m && row0 + r < p.n) store_out(p, t, row0 + r, v);
    }
}

template <int M>
void launch(const SmallMGemmParams& p, cudaStream_t stream) {
  const int warps = (p.n + kRows - 1) / kRows;
  launch_pdl("bf16_gemv", bf16_gemv_kernel<M>, dim3((warps + kWarps - 1) / kWarps),
             dim3(kWarps * 32), 0, stream, p);
}

}  // namespace

void bf16_gemv(const SmallMGemmParams& p, cudaStream_t stream) {
  static_assert(kBf16GemvMaxM == 4, "instantiations below cover m ≤ 4");
  if (p.m <= 1) {
    launch<1>(p, stream);
  } else if (p.m == 2) {
    launch<2>(p, stream);
  } else {
    launch<4>(p, stream);
  }
}

}  // namespace serval::kernels::cuda
