// bf16 GEMV for 1–4 tokens (see bf16_gemv.h). Warp = kRows consecutive weight rows over all of k.
// A "slice" is 256 columns: lane l holds columns 8l..8l+7 of it (one 16-byte load per row, 512
// contiguous bytes per warp). Stages of kSlices slices are double-buffered in registers, both
// requested before the PDL wait (a stage's slot is refilled as soon as it has been used); each lane
// keeps fp32 sums per (token, row), reduced across the warp with shuffles at the end. No split-K:
// every output is one warp's, so the summation order is fixed (deterministic, graph replays equal
// eager runs).
#include "kernels/cuda/gemm/bf16_gemv.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"

namespace serval::kernels::cuda {

namespace {

constexpr int kWarps = 4;   // warps per CTA: small CTAs spread small matrices over more SMs
constexpr int kRows = 2;    // weight rows per warp
constexpr int kSlices = 4;  // 256-column slices per stage (1024 columns)
constexpr int kSliceCols = 256;
constexpr int kMinCtas = 4;  // ≤ 128 registers: 16 warps per SM, 8 KB of weights in flight each

using Stage = uint4[kSlices][kRows];

__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Stage starting at slice s0 of the lane's rows; columns ≥ k read as zero.
__device__ __forceinline__ void load_stage(const __nv_bfloat16* const (&w)[kRows], int s0, int k,
                                           int lane, Stage& st) {
#pragma unroll
  for (int u = 0; u < kSlices; ++u) {
    const int col = (s0 + u) * kSliceCols + 8 * lane;
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      st[u][r] = col < k ? ld_stream(w[r] + col) : make_uint4(0, 0, 0, 0);
  }
}

// Σ_i w[i]·x[i] over eight bf16 pairs, added to acc (w as raw bf16 words: the fp32 value of a bf16
// is its bits shifted up 16).
__device__ __forceinline__ float dot8(const uint4& w, const float (&x)[8], float acc) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc = fmaf(__uint_as_float(words[i] << 16), x[2 * i], acc);
    acc = fmaf(__uint_as_float(words[i] & 0xFFFF0000u), x[2 * i + 1], acc);
  }
  return acc;
}

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
  const int k = p.k, slices = (k + kSliceCols - 1) / kSliceCols;
  const __nv_bfloat16* wb = reinterpret_cast<const __nv_bfloat16*>(p.w);
  const __nv_bfloat16* w[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) w[r] = wb + size_t(min(row0 + r, p.n - 1)) * k;

  Stage ring[2];
  if (active) {
    load_stage(w, 0, k, lane, ring[0]);
    if (kSlices < slices) load_stage(w, kSlices, k, lane, ring[1]);
  }
  pdl_wait();
  if (!active) return;  // no barriers in this kernel

  // Plain loads for activations: an invariant (__ldg) load could be hoisted above pdl_wait.
  const __nv_bfloat16* xb = reinterpret_cast<const __nv_bfloat16*>(p.x);
  float acc[M][kRows];
#pragma unroll
  for (int t = 0; t < M; ++t)
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[t][r] = 0.0f;

  for (int base = 0; base < slices; base += 2 * kSlices) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int s0 = base + j * kSlices;
      if (s0 >= slices) break;
#pragma unroll
      for (int u = 0; u < kSlices; ++u) {
        const int col = (s0 + u) * kSliceCols + 8 * lane;
        if (col >= k) continue;
#pragma unroll
        for (int t = 0; t < M; ++t) {
          float x[8];
          load8(xb + size_t(min(t, p.m - 1)) * k + col, x);
#pragma unroll
          for (int r = 0; r < kRows; ++r) acc[t][r] = dot8(ring[j][u][r], x, acc[t][r]);
        }
      }
      // The slot is free: refill it two stages ahead.
      if (s0 + 2 * kSlices < slices) load_stage(w, s0 + 2 * kSlices, k, lane, ring[j]);
    }
  }

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
