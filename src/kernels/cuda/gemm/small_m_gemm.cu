// bf16 small-M GEMM (see small_m_gemm.h for the fragment trick). Each warp owns 16 weight rows
// over a K range (split-K over grid.y when the rows alone do not fill the GPU) and streams them in
// stages of 128 columns (8 × 16-byte L1-bypassing loads per lane, 4 KB per warp), kDepth stages in
// flight; the first stages are requested before the PDL wait. Activations come through L1
// (16-byte loads, shared by every warp of the SM). Partial sums of a split go to an fp32 workspace
// that a second kernel adds in split order (deterministic).
#include "kernels/cuda/gemm/small_m_gemm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "base/error.h"
#include "kernels/cuda/gemm/bf16_gemv.h"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"

namespace serval::kernels::cuda {

namespace {

constexpr int kWarps = 4;              // warps (16-row groups) per CTA
constexpr int kSub = 4;                // 32-column sub-chunks per stage
constexpr int kChunkCols = 32 * kSub;  // columns per stage
constexpr int kDepth = 2;              // stages in flight per warp
constexpr int kMaxNi = kSmallMGemmMaxM / 8;

struct Args {
  SmallMGemmParams p;
  int groups;  // ceil(n / 16)
  int chunks;  // ceil(k / kChunkCols)
  int splits;
  bool fused_reduce;  // the last CTA of each grid column reduces (see g_split_arrivals)
};

__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Stage `chunk` of the lane's two rows (g, g+8): columns chunk·128 + 32c + 8t .. +7. Columns ≥ k
// (k % 8 == 0: all eight or none) are not read and stay zero.
__device__ __forceinline__ void load_stage(const __nv_bfloat16* w_lo, const __nv_bfloat16* w_hi,
                                           int chunk, int t, int k, uint4 (&st)[kSub][2]) {
#pragma unroll
  for (int c = 0; c < kSub; ++c) {
    const int col = chunk * kChunkCols + 32 * c + 8 * t;
    if (col < k) {
      st[c][0] = ld_stream(w_lo + col);
      st[c][1] = ld_stream(w_hi + col);
    } else {
      st[c][0] = st[c][1] = make_uint4(0, 0, 0, 0);
    }
  }
}

// Final value of output (tok, row) from its fp32 sum.
__device__ __forceinline__ void store_out(const SmallMGemmParams& p, int tok, int row, float v) {
  if (p.bias) v += __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p.bias)[row]);
  const size_t i = size_t(tok) * p.n + row;
  if (p.y_f32) {
    static_cast<float*>(p.y)[i] = v;
  } else {
    static_cast<__nv_bfloat16*>(p.y)[i] = __float2bfloat16_rn(v);
  }
}

// Split-K without a second kernel (Args::fused_reduce): the last CTA of each column of the grid to
// finish sums that column's partials in split order (what small_m_gemm_reduce does) and writes
// the output. Arrival counters live in device memory that is zero at module load; that last CTA
// resets its counter, so they are zero again for the next launch, which touches them only after
// pdl_wait (after this launch completed). Wider grids use the separate reduce kernel.
constexpr int kMaxCounterCtas = 4096;
__device__ unsigned int g_split_arrivals[kMaxCounterCtas];

// Warp `grp`'s 16 rows × all tokens over chunks [c0, c1) (first kDepth stages already in `ring`):
// to the output, or as split partials in the workspace.
template <int NI>
__device__ __forceinline__ void compute_group(const Args& d, int grp, int split, int c0, int c1,
                                              int lane, const __nv_bfloat16* w_lo,
                                              const __nv_bfloat16* w_hi,
                                              uint4 (&ring)[kDepth][kSub][2]) {
  const int g = lane >> 2, t = lane & 3;
  const SmallMGemmParams& p = d.p;
  const int n = p.n, k = p.k;
  // Plain (not __ldg) loads for activations: an invariant load could be hoisted above pdl_wait.
  // Token g of each n8 block (clamped to a valid row; results of tokens ≥ m are never stored).
  const __nv_bfloat16* x = reinterpret_cast<const __nv_bfloat16*>(p.x);
  const __nv_bfloat16* xrow[NI];
#pragma unroll
  for (int ni = 0; ni < NI; ++ni) xrow[ni] = x + size_t(min(ni * 8 + g, p.m - 1)) * k;

  float acc[NI][4];
#pragma unroll
  for (int ni = 0; ni < NI; ++ni)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[ni][q] = 0.0f;

  for (int base = c0; base < c1; base += kDepth) {
#pragma unroll
    for (int j = 0; j < kDepth; ++j) {
      const int chunk = base + j;
      if (chunk >= c1) break;
      uint4 cur[kSub][2];
#pragma unroll
      for (int c = 0; c < kSub; ++c) {
        cur[c][0] = ring[j][c][0];
        cur[c][1] = ring[j][c][1];
      }
      if (chunk + kDepth < c1) load_stage(w_lo, w_hi, chunk + kDepth, t, k, ring[j]);
#pragma unroll
      for (int c = 0; c < kSub; ++c) {
        const int col = chunk * kChunkCols + 32 * c + 8 * t;
        uint4 xb[NI];
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
          xb[ni] =
              col < k ? *reinterpret_cast<const uint4*>(xrow[ni] + col) : make_uint4(0, 0, 0, 0);
        const uint4 lo = cur[c][0], hi = cur[c][1];
        // k16 step 0: words 0 (pair t) and 1 (pair t + 4); step 1: words 2 and 3.
        const uint32_t a0[4] = {lo.x, hi.x, lo.y, hi.y};
        const uint32_t a1[4] = {lo.z, hi.z, lo.w, hi.w};
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
          mma_bf16(acc[ni], a0, xb[ni].x, xb[ni].y);
          mma_bf16(acc[ni], a1, xb[ni].z, xb[ni].w);
        }
      }
    }
  }

  // Accumulator q of block ni: row g + 8·(q / 2), token ni·8 + 2t + q % 2.
#pragma unroll
  for (int ni = 0; ni < NI; ++ni)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int row = grp * 16 + g + 8 * (q >> 1);
      const int tok = ni * 8 + 2 * t + (q & 1);
      if (row >= n || tok >= p.m) continue;
      if (d.splits > 1) {
        static_cast<float*>(p.workspace)[(size_t(split) * p.m + tok) * n + row] = acc[ni][q];
      } else {
        store_out(p, tok, row, acc[ni][q]);
      }
    }
}

// Sums the partials of output rows [row0, row1) of every token in split order, then the epilogue.
// Called by all threads of one CTA.
__device__ __forceinline__ void reduce_rows(const Args& d, int row0, int row1) {
  const int rows = row1 - row0;
  const size_t total = size_t(d.p.m) * d.p.n;
  const float* ws = static_cast<const float*>(d.p.workspace);
  for (int i = threadIdx.x; i < rows * d.p.m; i += blockDim.x) {
    const int tok = i / rows, row = row0 + i % rows;
    const size_t at = size_t(tok) * d.p.n + row;
    float v = 0.0f;
    for (int s = 0; s < d.splits; ++s) v += ws[size_t(s) * total + at];
    store_out(d.p, tok, row, v);
  }
}

// Grid (ceil(groups / kWarps), splits); warp = 16 rows × 8·NI tokens (NI·8 ≥ m).
template <int NI>
__global__ void __launch_bounds__(kWarps * 32) small_m_gemm_kernel(Args d) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int grp = blockIdx.x * kWarps + warp;
  const bool active = grp < d.groups;
  const int n = d.p.n, k = d.p.k;
  const int split = blockIdx.y;
  const int c0 = int(int64_t(split) * d.chunks / d.splits);
  const int c1 = int(int64_t(split + 1) * d.chunks / d.splits);
  const __nv_bfloat16* w = reinterpret_cast<const __nv_bfloat16*>(d.p.w);
  // Rows ≥ n are clamped to a valid row: their results are never stored.
  const __nv_bfloat16* w_lo = w + size_t(min(grp * 16 + g, n - 1)) * k;
  const __nv_bfloat16* w_hi = w + size_t(min(grp * 16 + g + 8, n - 1)) * k;

  uint4 ring[kDepth][kSub][2];
#pragma unroll
  for (int j = 0; j < kDepth; ++j)
    if (active && c0 + j < c1) load_stage(w_lo, w_hi, c0 + j, t, k, ring[j]);
  pdl_wait();
  if (active) compute_group<NI>(d, grp, split, c0, c1, lane, w_lo, w_hi, ring);
  if (d.splits == 1 || !d.fused_reduce) return;

  // Every thread of the CTA takes part from here on (inactive warps too: there are barriers).
  __shared__ bool last;
  __threadfence();  // this CTA's partials are visible before its arrival is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(&g_split_arrivals[blockIdx.x], 1u) == unsigned(d.splits - 1);
  }
  __syncthreads();
  if (!last) return;
  __threadfence();  // see the other CTAs' partials
  const int row0 = blockIdx.x * kWarps * 16, row1 = min(n, row0 + kWarps * 16);
  reduce_rows(d, row0, row1);
  if (threadIdx.x == 0) g_split_arrivals[blockIdx.x] = 0;
}

// out[tok, row] = Σ_s partial[s, tok, row] in split order, then bias and the output cast (grids
// wider than kMaxCounterCtas columns).
__global__ void __launch_bounds__(256) small_m_gemm_reduce(Args d) {
  pdl_wait();
  const size_t total = size_t(d.p.m) * d.p.n;
  const float* ws = static_cast<const float*>(d.p.workspace);
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    float v = 0.0f;
    for (int s = 0; s < d.splits; ++s) v += ws[size_t(s) * total + i];
    store_out(d.p, int(i / d.p.n), int(i % d.p.n), v);
  }
}

// Split-K factor: ~24 warps per SM (8 KB in flight each), at least kDepth stages per split, and
// partial-sum traffic (write + read, 8·s·m·n bytes) at most a quarter of the weight bytes (2·n·k).
int splits_for(int m, int n, int k) {
  const int groups = (n + 15) / 16, chunks = (k + kChunkCols - 1) / kChunkCols;
  int s = std::max(1, sm_count() * 24 / groups);
  s = std::min(s, std::max(1, chunks / kDepth));
  s = std::min(s, std::max(1, k / (16 * std::max(m, 1))));
  return std::min(s, 32);
}

template <int NI>
void launch(const Args& d, cudaStream_t stream) {
  const dim3 grid((d.groups + kWarps - 1) / kWarps, d.splits);
  launch_pdl("small_m_gemm", small_m_gemm_kernel<NI>, grid, dim3(kWarps * 32), 0, stream, d);
}

}  // namespace

bool small_m_gemm_supported(const void* x, const void* w, int m, int k) {
  return m >= 1 && m <= kSmallMGemmMaxM && k > 0 && k % 8 == 0 && is_aligned16(x) &&
         is_aligned16(w);
}

size_t small_m_gemm_workspace_bytes(int m, int n, int k) {
  if (m <= kBf16GemvMaxM || n <= 0 || k <= 0) return 0;  // the GEMV needs none
  const int s = splits_for(m, n, k);
  return s > 1 ? size_t(s) * m * n * sizeof(float) : 0;
}

void small_m_gemm(const SmallMGemmParams& p, cudaStream_t stream) {
  if (p.n <= 0 || !small_m_gemm_supported(p.x, p.w, p.m, p.k))
    throw InvalidArgument(
        "small_m_gemm: need 1 <= m <= " + std::to_string(kSmallMGemmMaxM) +
        ", n > 0, k % 8 == 0 and 16-byte aligned x and w; got m = " + std::to_string(p.m) +
        ", n = " + std::to_string(p.n) + ", k = " + std::to_string(p.k));
  if (p.m <= kBf16GemvMaxM) {
    bf16_gemv(p, stream);
    return;
  }
  Args d{};
  d.p = p;
  d.groups = (p.n + 15) / 16;
  d.chunks = (p.k + kChunkCols - 1) / kChunkCols;
  d.splits = splits_for(p.m, p.n, p.k);
  const size_t need = small_m_gemm_workspace_bytes(p.m, p.n, p.k);
  if (d.splits > 1 && (p.workspace == nullptr || p.workspace_bytes < need))
    throw InvalidArgument("small_m_gemm: workspace too small (" +
                          std::to_string(p.workspace_bytes) + " < " + std::to_string(need) + ")");
  d.fused_reduce = (d.groups + kWarps - 1) / kWarps <= kMaxCounterCtas;
  static_assert(kMaxNi == 8, "token tiles below assume kSmallMGemmMaxM == 64");
  if (p.m <= 8) {
    launch<1>(d, stream);
  } else if (p.m <= 16) {
    launch<2>(d, stream);
  } else if (p.m <= 32) {
    launch<4>(d, stream);
  } else {
    launch<8>(d, stream);
  }
  if (d.splits > 1 && !d.fused_reduce) {
    const size_t total = size_t(p.m) * p.n;
    const int blocks = int(std::min<size_t>((total + 255) / 256, size_t(sm_count()) * 8));
    launch_pdl("small_m_gemm_reduce", small_m_gemm_reduce, dim3(blocks), dim3(256), 0, stream, d);
  }
}

}  // namespace serval::kernels::cuda
