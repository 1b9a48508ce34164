// Per-head linears (head_linear.h).
//
// Streaming path (≤ kHeadLinearGemvMaxTokens tokens): grid (row blocks, heads). The CTA copies its
// head's inputs of all tokens into shared memory as fp32; a group of `lanes` threads (a power of
// two ≤ 32) owns one weight row at a time, each thread reading 16-byte chunks lane, lane + lanes,
// ... of it for 4 rows at once, one chunk ahead, and the group sums its partial dots by shuffles.
// Tiled path: grid (n / 64, tokens / 64, heads), a 64 × 64 output tile per CTA in 4 × 4 blocks
// per thread over k steps of 32 staged (fp32, k-major) in shared memory.
#include <cuda_bf16.h>

#include <string>

#include "base/error.h"
#include "base/math.h"
#include "kernels/cuda/gemm/head_linear.h"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"

namespace serval::kernels::cuda {
namespace {

constexpr int kGemvThreads = 256;
constexpr int kGemvRows = 4;                   // weight rows per thread group at once
constexpr int kGemvMaxInputs = 48 * 1024 / 4;  // fp32 inputs in static-limit shared memory
constexpr int kTileM = 64, kTileN = 64, kTileK = 32;
constexpr int kTiledThreads = 256;  // 16 × 16 threads, 4 × 4 outputs each
static_assert(kTileM == 4 * 16 && kTileN == 4 * 16);

__device__ __forceinline__ float bf16_value(const bf16& v) {
  return __uint_as_float(uint32_t(v.bits) << 16);
}

// acc + Σ_i w[i] · x[i] over 8 bf16 weights w (element 0 in the low half of w.x) and x = (a, b).
__device__ __forceinline__ float dot8(const uint4& w, const float4& a, const float4& b, float acc) {
  acc = fmaf(__uint_as_float(w.x << 16), a.x, acc);
  acc = fmaf(__uint_as_float(w.x & 0xFFFF0000u), a.y, acc);
  acc = fmaf(__uint_as_float(w.y << 16), a.z, acc);
  acc = fmaf(__uint_as_float(w.y & 0xFFFF0000u), a.w, acc);
  acc = fmaf(__uint_as_float(w.z << 16), b.x, acc);
  acc = fmaf(__uint_as_float(w.z & 0xFFFF0000u), b.y, acc);
  acc = fmaf(__uint_as_float(w.w << 16), b.z, acc);
  acc = fmaf(__uint_as_float(w.w & 0xFFFF0000u), b.w, acc);
  return acc;
}

// kT ≥ num_tokens accumulators per row; 2^log_lanes threads per row. Dynamic shared memory: kT · k
// floats.
template <int kT>
__global__ void __launch_bounds__(kGemvThreads)
    head_linear_gemv_kernel(const HeadLinearParams p, int log_lanes) {
  extern __shared__ __align__(16) float xs[];  // [kT, k]
  const int h = blockIdx.y, k = p.k, chunks = k / 8;
  const int lanes = 1 << log_lanes;
  const int sub = threadIdx.x & (lanes - 1), group = threadIdx.x >> log_lanes;
  const int groups = kGemvThreads >> log_lanes;
  const int row0 = int(blockIdx.x) * groups * kGemvRows + group;
  const bf16* wh = p.w + int64_t(h) * p.n * k;
  bool ok[kGemvRows];
  const bf16* wr[kGemvRows];
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r) {
    const int row = row0 + r * groups;
    ok[r] = row < p.n;
    wr[r] = wh + int64_t(ok[r] ? row : 0) * k;
  }
  uint4 next[kGemvRows];
  auto fetch = [&](int c) {
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r)
      next[r] = ok[r] && c < chunks ? ld_stream16(wr[r] + 8 * c) : make_uint4(0, 0, 0, 0);
  };
  fetch(sub);  // weights: before the wait
  pdl_wait();
  pdl_launch_dependents();
  for (int e = threadIdx.x; e < kT * k; e += kGemvThreads) {
    const int t = e / k, j = e - t * k;
    xs[e] =
        t < p.num_tokens ? bf16_value(p.x[(int64_t(t) * p.num_heads + h) * p.x_stride + j]) : 0.0f;
  }
  __syncthreads();

  float acc[kGemvRows][kT];
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r)
#pragma unroll
    for (int t = 0; t < kT; ++t) acc[r][t] = 0.0f;
  for (int c = sub; c < chunks; c += lanes) {
    uint4 cur[kGemvRows];
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) cur[r] = next[r];
    fetch(c + lanes);
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      const float4* xp = reinterpret_cast<const float4*>(xs + t * k + 8 * c);
      const float4 a = xp[0], b = xp[1];
#pragma unroll
      for (int r = 0; r < kGemvRows; ++r) acc[r][t] = dot8(cur[r], a, b, acc[r][t]);
    }
  }
  for (int offset = lanes >> 1; offset > 0; offset >>= 1) {
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r)
#pragma unroll
      for (int t = 0; t < kT; ++t) acc[r][t] += __shfl_xor_sync(0xffffffffu, acc[r][t], offset);
  }
  if (sub != 0) return;
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r) {
    if (!ok[r]) continue;
    const int row = row0 + r * groups;
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      if (t < p.num_tokens)
        *reinterpret_cast<__nv_bfloat16*>(p.y + (int64_t(t) * p.num_heads + h) * p.n + row) =
            __float2bfloat16_rn(acc[r][t]);
    }
  }
}

__global__ void __launch_bounds__(kTiledThreads)
    head_linear_tiled_kernel(const HeadLinearParams p) {
  __shared__ __align__(16) float xs[kTileK][kTileM + 4];  // [k, token]
  __shared__ __align__(16) float ws[kTileK][kTileN + 4];  // [k, row]
  const int h = blockIdx.z, m0 = int(blockIdx.y) * kTileM, n0 = int(blockIdx.x) * kTileN;
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const bf16* wh = p.w + int64_t(h) * p.n * p.k;
  float acc[4][4] = {};
  pdl_wait();
  pdl_launch_dependents();
  for (int k0 = 0; k0 < p.k; k0 += kTileK) {
    for (int e = threadIdx.x; e < kTileM * kTileK; e += kTiledThreads) {
      const int r = e / kTileK, j = e % kTileK, kk = k0 + j;
      const int t = m0 + r, row = n0 + r;
      xs[j][r] = t < p.num_tokens && kk < p.k
                     ? bf16_value(p.x[(int64_t(t) * p.num_heads + h) * p.x_stride + kk])
                     : 0.0f;
      ws[j][r] = row < p.n && kk < p.k ? bf16_value(wh[int64_t(row) * p.k + kk]) : 0.0f;
    }
    __syncthreads();
#pragma unroll 8
    for (int j = 0; j < kTileK; ++j) {
      const float4 a = *reinterpret_cast<const float4*>(&xs[j][ty * 4]);
      const float4 b = *reinterpret_cast<const float4*>(&ws[j][tx * 4]);
      const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[i][c] = fmaf(av[i], bv[c], acc[i][c]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int t = m0 + ty * 4 + i;
    if (t >= p.num_tokens) continue;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int row = n0 + tx * 4 + c;
      if (row < p.n)
        *reinterpret_cast<__nv_bfloat16*>(p.y + (int64_t(t) * p.num_heads + h) * p.n + row) =
            __float2bfloat16_rn(acc[i][c]);
    }
  }
}

template <int kT>
void launch_gemv(const HeadLinearParams& p, cudaStream_t stream) {
  const int chunks = p.k / 8;
  int log_lanes = 0;
  while (log_lanes < 5 && (2 << log_lanes) <= chunks) ++log_lanes;
  const int rows_per_cta = (kGemvThreads >> log_lanes) * kGemvRows;
  const dim3 grid(unsigned(ceil_div(p.n, rows_per_cta)), unsigned(p.num_heads));
  launch_pdl("head_linear", head_linear_gemv_kernel<kT>, grid, dim3(kGemvThreads),
             size_t(kT) * p.k * sizeof(float), stream, p, log_lanes);
}

}  // namespace

void head_linear(const HeadLinearParams& p, cudaStream_t stream) {
  if (p.num_tokens < 0 || p.num_heads <= 0 || p.n <= 0 || p.k <= 0 || p.x_stride < p.k)
    throw InvalidArgument("cuda head_linear: " + std::to_string(p.num_tokens) + " tokens, " +
                          std::to_string(p.num_heads) + " heads, n " + std::to_string(p.n) +
                          ", k " + std::to_string(p.k) + ", x_stride " +
                          std::to_string(p.x_stride) + " (positive sizes, x_stride ≥ k)");
  if (p.num_heads > 65535)
    throw InvalidArgument("cuda head_linear: " + std::to_string(p.num_heads) +
                          " heads exceed the grid (65535)");
  if (p.num_tokens == 0) return;
  const bool stream_w = p.k % 8 == 0 && is_aligned16(p.w);
  const auto fits = [&](int max_tokens) {
    return p.num_tokens <= max_tokens && max_tokens * p.k <= kGemvMaxInputs;
  };
  if (stream_w && fits(1)) return launch_gemv<1>(p, stream);
  if (stream_w && fits(2)) return launch_gemv<2>(p, stream);
  if (stream_w && fits(4)) return launch_gemv<4>(p, stream);
  if (stream_w && fits(kHeadLinearGemvMaxTokens))
    return launch_gemv<kHeadLinearGemvMaxTokens>(p, stream);
  if (ceil_div(p.num_tokens, kTileM) > 65535)
    throw InvalidArgument("cuda head_linear: " + std::to_string(p.num_tokens) +
                          " tokens exceed the grid");
  const dim3 grid(unsigned(ceil_div(p.n, kTileN)), unsigned(ceil_div(p.num_tokens, kTileM)),
                  unsigned(p.num_heads));
  launch_pdl("head_linear", head_linear_tiled_kernel, grid, dim3(kTiledThreads), 0, stream, p);
}

}  // namespace serval::kernels::cuda
