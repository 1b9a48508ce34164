// Weight-only NVFP4 / FP8 GEMMs on mma.sync m16n8k16 (bf16 → fp32), swap-AB: weight rows are the
// MMA M side, tokens the N side. Each warp streams one 32-row tile of the weight (fragment layout,
// see quant_gemm.h) over a K range with 16-byte L1-bypassing loads, dequantizes in registers with
// integer bit operations and one bf16x2 multiply per register, and reads activations straight
// from L1/L2 (they are tiny and shared by every warp). All tokens of a step (m ≤ 64) share one
// pass over the weights; each warp keeps several k blocks of loads in flight (issued before the
// PDL wait for the first ones). Split-K over grid.y writes fp32 partials that a second kernel sums
// in a fixed order (deterministic).
#include "kernels/cuda/gemm/quant_gemm.h"
#include "kernels/cuda/gemm/quant_gemv.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "base/error.h"
#include "kernels/cuda/gemm/quant_fragment.cuh"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"

namespace serval::kernels::cuda {

namespace {

constexpr int kWarps = 4;  // warps (row tiles) per CTA

struct DeviceArgs {
  QuantGemmParams p;
  float alpha;             // NVFP4: global_scale·2^7; FP8 per-tensor: global_scale; else 1
  const float* row_scale;  // FP8 per-channel [n], else null
  const uint16_t* block;   // FP8 block multipliers (bf16 bits), else null
  int block_cols;          // ceil(k / block_k)
  int k_blocks;            // k_pad / 64
  int n_tiles;             // n_pad / 32
  int splits;
  bool fused_reduce;  // the last CTA of each grid column reduces (g_quant_split_arrivals)
};

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// FP8 multiplier of rows (row, row+8) at column col: block table entry or the constant 2^120.
__device__ __forceinline__ void fp8_mults(const DeviceArgs& d, int row, int col, uint32_t& m_lo,
                                          uint32_t& m_hi) {
  if (d.block == nullptr) {
    m_lo = m_hi = kFp8Mult;
    return;
  }
  const QuantGemmWeight& w = d.p.w;
  const int c = min(col, w.k - 1) / w.block_k;  // padded rows/columns: any valid entry (codes 0)
  const int r0 = min(row, w.n - 1) / w.block_n, r1 = min(row + 8, w.n - 1) / w.block_n;
  const uint32_t h0 = __ldg(d.block + size_t(r0) * d.block_cols + c);
  const uint32_t h1 = __ldg(d.block + size_t(r1) * d.block_cols + c);
  m_lo = h0 | (h0 << 16);
  m_hi = h1 | (h1 << 16);
}

// Final value of output (tok, row) from its fp32 sum.
__device__ __forceinline__ void store_out(const DeviceArgs& d, int tok, int row, float v) {
  const QuantGemmParams& p = d.p;
  v *= d.alpha;
  if (d.row_scale) v *= d.row_scale[row];
  if (p.bias) v += __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p.bias)[row]);
  const size_t i = size_t(tok) * p.w.n + row;
  if (p.y_f32) {
    static_cast<float*>(p.y)[i] = v;
  } else {
    static_cast<__nv_bfloat16*>(p.y)[i] = __float2bfloat16_rn(v);
  }
}

// Lane bytes of (row tile rt, k block kb, group h).
template <bool kFp4>
__device__ __forceinline__ const uint8_t* lane_ptr(const uint8_t* data, int k_blocks, int rt,
                                                   int kb, int h, int lane) {
  constexpr int kB = kFp4 ? 16 : 32;
  return data + ((size_t(rt * k_blocks + kb) * 2 + h) * 32 + lane) * kB;
}

// One k block's raw bytes of both groups of a lane (and the NVFP4 scale words of rows g, g+8).
template <bool kFp4>
struct Raw {
  static constexpr int kWords = kFp4 ? 4 : 8;
  uint32_t w[2][kWords];
  uint32_t sf[2][2];
};

template <bool kFp4>
__device__ __forceinline__ void load_raw(const DeviceArgs& d, int rt, int kb, int lane,
                                         Raw<kFp4>& r) {
  const QuantGemmWeight& w = d.p.w;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint8_t* src = lane_ptr<kFp4>(w.data, d.k_blocks, rt, kb, h, lane);
#pragma unroll
    for (int c = 0; c < Raw<kFp4>::kWords / 4; ++c) {
      const uint4 v = ld_stream16(src + 16 * c);
      r.w[h][4 * c] = v.x;
      r.w[h][4 * c + 1] = v.y;
      r.w[h][4 * c + 2] = v.z;
      r.w[h][4 * c + 3] = v.w;
    }
  }
  if constexpr (kFp4) {
    // Words of rows g, g+8, 16+g, 24+g of the tile's 128-byte scale tile (quant_gemm.h).
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(w.scales) +
                                                         (size_t(rt) * d.k_blocks + kb) * 128) +
                          (lane >> 2));
    r.sf[0][0] = v.x;
    r.sf[0][1] = v.y;
    r.sf[1][0] = v.z;
    r.sf[1][1] = v.w;
  }
}

// Split-K without a second kernel (DeviceArgs::fused_reduce): the last CTA of each grid column
// (x, z) to finish sums that column's partials in split order (as quant_gemm_reduce does) and
// writes the output. Arrival counters live in device memory that is zero at module load; that
// last CTA resets its counter, so they are zero again for the next launch, which touches them
// only after pdl_wait (after this launch completed). Wider grids use the separate reduce kernel.
constexpr int kMaxCounterCtas = 4096;
__device__ unsigned int g_quant_split_arrivals[kMaxCounterCtas];

// Warp `rt`'s 32 rows × the token tile over k blocks [kb0, kb1) (first kDepth blocks already in
// `ring`): to the output, or as split partials in the workspace. kVecX (k % 64 == 0 and x 16-byte
// aligned: every real model): lane t's activations of a k block are its 8 consecutive words per
// token, two 16-byte loads with no bounds checks, and the k block's A fragments are decoded once
// for all token blocks; otherwise 4-byte loads per step, columns ≥ k read as zero.
template <bool kFp4, int NI, int kDepth, bool kVecX>
__device__ __forceinline__ void quant_gemm_tile(const DeviceArgs& d, const uint32_t* sf_table,
                                                int rt, int split, int kb0, int kb1, int lane,
                                                Raw<kFp4> (&ring)[kDepth]) {
  const QuantGemmParams& p = d.p;
  const int tok0 = blockIdx.z * 8 * NI;
  const int g = lane >> 2, t = lane & 3;
  const int k = p.w.k;

  // B fragments: token g of each n8 block (clamped to a valid row: columns of the MMA are
  // independent, and results of tokens ≥ m are never stored).
  const __nv_bfloat16* x = reinterpret_cast<const __nv_bfloat16*>(p.x);
  const __nv_bfloat16* xrow[NI];
#pragma unroll
  for (int ni = 0; ni < NI; ++ni) xrow[ni] = x + size_t(min(tok0 + ni * 8 + g, p.m - 1)) * k;

  float acc[2][NI][4];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[h][ni][q] = 0.0f;

  for (int base = kb0; base < kb1; base += kDepth) {
#pragma unroll
    for (int j = 0; j < kDepth; ++j) {
      const int kb = base + j;
      if (kb >= kb1) break;
      const Raw<kFp4> cur = ring[j];
      if (kb + kDepth < kb1) load_raw<kFp4>(d, rt, kb + kDepth, lane, ring[j]);
      // Lane t's columns are 16t .. 16t+15 of the block in every step (quant_gemm.h): one NVFP4
      // scale group / FP8 block, so one multiplier pair per group h and k block.
      uint32_t m_lo[2], m_hi[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (kFp4) {
          m_lo[h] = sf_table[(cur.sf[h][0] >> (8 * t)) & 0xFFu];
          m_hi[h] = sf_table[(cur.sf[h][1] >> (8 * t)) & 0xFFu];
        } else {
          fp8_mults(d, rt * 32 + h * 16 + g, kb * 64 + 16 * t, m_lo[h], m_hi[h]);
        }
      }
      if constexpr (kVecX) {
        uint32_t a[2][4][4];  // [group h][step s] A fragments of this k block
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int s = 0; s < 4; ++s) decode_step<kFp4>(cur.w[h], s, m_lo[h], m_hi[h], a[h][s]);
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
          // Words 2s, 2s+1 are step s's b0 (columns 16t + 4s, +1) and b1 (16t + 4s + 2, +3).
          // Plain loads: an invariant (__ldg) load could be hoisted above pdl_wait.
          const uint4* xp = reinterpret_cast<const uint4*>(xrow[ni] + kb * 64 + 16 * t);
          const uint4 lo = xp[0], hi = xp[1];
          const uint32_t bw[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
          for (int s = 0; s < 4; ++s)
#pragma unroll
            for (int h = 0; h < 2; ++h) mma_bf16(acc[h][ni], a[h][s], bw[2 * s], bw[2 * s + 1]);
        }
      } else {
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          // Physical columns c0 .. c0+3 (k % 8 == 0: wholly inside k or wholly past it).
          const int c0 = kb * 64 + 16 * t + 4 * s;
          uint32_t b[NI][2];
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) {
            b[ni][0] = c0 < k ? *reinterpret_cast<const unsigned int*>(xrow[ni] + c0) : 0u;
            b[ni][1] = c0 < k ? *reinterpret_cast<const unsigned int*>(xrow[ni] + c0 + 2) : 0u;
          }
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            uint32_t a[4];
            decode_step<kFp4>(cur.w[h], s, m_lo[h], m_hi[h], a);
#pragma unroll
            for (int ni = 0; ni < NI; ++ni) mma_bf16(acc[h][ni], a, b[ni][0], b[ni][1]);
          }
        }
      }
    }
  }

  // Accumulator q of (h, ni): row g + 8·(q / 2) of group h, token 2t + q % 2 of block ni.
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int row = rt * 32 + h * 16 + g + 8 * (q >> 1);
        const int tok = tok0 + ni * 8 + 2 * t + (q & 1);
        if (row >= p.w.n || tok >= p.m) continue;
        if (d.splits > 1) {
          static_cast<float*>(p.workspace)[(size_t(split) * p.m + tok) * p.w.n + row] =
              acc[h][ni][q];
        } else {
          store_out(d, tok, row, acc[h][ni][q]);
        }
      }
}

// Grid (ceil(n_tiles / kWarps), splits, ceil(m / (8·NI))); warp = one 32-row tile × 8·NI tokens
// (all tokens of a decode step in one pass over the weights for m ≤ 64). The first kDepth k
// blocks are requested before pdl_wait (weights are constant during a step); afterwards a ring of
// kDepth blocks stays in flight: slot j is refilled with block kb + kDepth as soon as block kb has
// been decoded.
//
// The kernel is bound by instructions per weight, not bytes (NVFP4 and FP8 ran at the same
// weights/s on the H200), so the per-weight work is trimmed: NVFP4 block-scale multipliers come
// from a 256-entry shared table (one shared load instead of the e4m3 → bf16 arithmetic), and
// kVecX (quant_gemm_tile) loads the activations as 16-byte vectors without bounds checks.
template <bool kFp4, int NI, bool kVecX>
__global__ void __launch_bounds__(kWarps * 32) quant_gemm_kernel(DeviceArgs d) {
  constexpr int kDepth = kFp4 ? 4 : 2;           // 4 KB (NVFP4) / 8 KB (FP8) in flight per warp
  __shared__ uint32_t sf_table[kFp4 ? 256 : 1];  // nvfp4_mult(byte) for every byte
  if constexpr (kFp4) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) sf_table[i] = nvfp4_mult(uint32_t(i));
    __syncthreads();
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rt = blockIdx.x * kWarps + warp;
  const bool active = rt < d.n_tiles;
  const int split = blockIdx.y;
  const int kb0 = int(int64_t(split) * d.k_blocks / d.splits);
  const int kb1 = int(int64_t(split + 1) * d.k_blocks / d.splits);
  Raw<kFp4> ring[kDepth];
#pragma unroll
  for (int j = 0; j < kDepth; ++j)
    if (active && kb0 + j < kb1) load_raw<kFp4>(d, rt, kb0 + j, lane, ring[j]);
  pdl_wait();
  if (active)
    quant_gemm_tile<kFp4, NI, kDepth, kVecX>(d, sf_table, rt, split, kb0, kb1, lane, ring);
  if (d.splits == 1 || !d.fused_reduce) return;

  // Every thread of the CTA takes part from here on (inactive warps too: there are barriers).
  __shared__ bool last;
  __syncthreads();  // every thread's partials before thread 0's arrival, which releases them
  const int column = blockIdx.z * gridDim.x + blockIdx.x;
  if (threadIdx.x == 0)
    last = arrive_acq_rel(&g_quant_split_arrivals[column]) == unsigned(d.splits - 1);
  __syncthreads();  // thread 0 acquired the other CTAs' partials: every thread reads after it
  if (!last) return;
  const QuantGemmParams& p = d.p;
  const int row0 = blockIdx.x * kWarps * 32, row1 = min(p.w.n, row0 + kWarps * 32);
  const int tok0 = blockIdx.z * 8 * NI, tok1 = min(p.m, tok0 + 8 * NI);
  const int rows = row1 - row0;
  const size_t total = size_t(p.m) * p.w.n;
  const float* ws = static_cast<const float*>(p.workspace);
  for (int i = threadIdx.x; i < rows * (tok1 - tok0); i += blockDim.x) {
    const int tok = tok0 + i / rows, row = row0 + i % rows;
    const size_t at = size_t(tok) * p.w.n + row;
    float v = 0.0f;
    for (int sp = 0; sp < d.splits; ++sp) v += ws[size_t(sp) * total + at];
    store_out(d, tok, row, v);
  }
  if (threadIdx.x == 0) g_quant_split_arrivals[column] = 0;
}

// out[tok, row] = Σ_s partial[s, tok, row] in split order, then the epilogue.
__global__ void __launch_bounds__(256) quant_gemm_reduce(DeviceArgs d) {
  pdl_wait();
  const size_t total = size_t(d.p.m) * d.p.w.n;
  const float* ws = static_cast<const float*>(d.p.workspace);
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    float v = 0.0f;
    for (int s = 0; s < d.splits; ++s) v += ws[size_t(s) * total + i];
    store_out(d, int(i / d.p.w.n), int(i % d.p.w.n), v);
  }
}

constexpr int kDequantWarps = 8;
constexpr int kTileStride = 72;  // bf16 per staged row: 64 + 8 pad (16-byte aligned rows)

// Each warp dequantizes whole (row tile, k block) tiles of 32 rows × 64 columns: the GEMM's
// register decode, u32 writes into a per-warp shared tile, then 16-byte coalesced stores of
// complete 128-byte row segments (out rows are 16-byte aligned: k % 8 == 0, out 16-byte aligned).
// The next tile's bytes are loaded before the current one is stored.
template <bool kFp4>
__global__ void __launch_bounds__(kDequantWarps * 32)
    dequant_kernel(DeviceArgs d, __nv_bfloat16* out) {
  __shared__ __align__(16) uint32_t tile_smem[kDequantWarps][32 * kTileStride / 2];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  uint32_t* tile = tile_smem[warp];
  const QuantGemmWeight& w = d.p.w;
  const int64_t tiles = int64_t(d.n_tiles) * d.k_blocks;
  const int64_t stride = int64_t(gridDim.x) * kDequantWarps;
  int64_t id = int64_t(blockIdx.x) * kDequantWarps + warp;
  Raw<kFp4> nxt;
  if (id < tiles) load_raw<kFp4>(d, int(id / d.k_blocks), int(id % d.k_blocks), lane, nxt);
  for (; id < tiles; id += stride) {
    const int rt = int(id / d.k_blocks), kb = int(id % d.k_blocks);
    const Raw<kFp4> r = nxt;
    if (id + stride < tiles)
      load_raw<kFp4>(d, int((id + stride) / d.k_blocks), int((id + stride) % d.k_blocks), lane,
                     nxt);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float rs[2] = {1.0f, 1.0f};
      if (d.row_scale) {
        rs[0] = d.row_scale[min(rt * 32 + h * 16 + g, w.n - 1)];
        rs[1] = d.row_scale[min(rt * 32 + h * 16 + g + 8, w.n - 1)];
      }
      uint32_t m_lo, m_hi;  // lane t's columns: scale group / FP8 block of column 16t
      if constexpr (kFp4) {
        m_lo = nvfp4_mult((r.sf[h][0] >> (8 * t)) & 0xFFu);
        m_hi = nvfp4_mult((r.sf[h][1] >> (8 * t)) & 0xFFu);
      } else {
        fp8_mults(d, rt * 32 + h * 16 + g, kb * 64 + 16 * t, m_lo, m_hi);
      }
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        uint32_t a[4];
        decode_step<kFp4>(r.w[h], s, m_lo, m_hi, a);
        uint32_t v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          // Same rounding as the CPU reference: fp32 (value · alpha · row scale) → bf16 once.
          const float lo = __uint_as_float(a[i] << 16) * d.alpha * rs[i & 1];
          const float hi = __uint_as_float(a[i] & 0xFFFF0000u) * d.alpha * rs[i & 1];
          const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
          v[i] = *reinterpret_cast<const uint32_t*>(&b);
        }
        // a_i and a_i+2 are columns c .. c+3 of one row (c = 16t + 4s): one 8-byte store each.
#pragma unroll
        for (int rp = 0; rp < 2; ++rp) {
          const int row = h * 16 + g + 8 * rp, col = 16 * t + 4 * s;
          *reinterpret_cast<uint2*>(tile + (row * kTileStride + col) / 2) =
              make_uint2(v[rp], v[rp + 2]);
        }
      }
    }
    __syncwarp();
    // 32 rows × 8 16-byte chunks: lane → (row lane / 8 + 4·it, chunk lane % 8).
#pragma unroll
    for (int it = 0; it < 8; ++it) {
      const int row = lane / 8 + 4 * it, chunk = lane % 8;
      const int grow = rt * 32 + row, gcol = kb * 64 + chunk * 8;
      if (grow < w.n && gcol < w.k)
        *reinterpret_cast<uint4*>(out + size_t(grow) * w.k + gcol) =
            *reinterpret_cast<const uint4*>(tile + (row * kTileStride + chunk * 8) / 2);
    }
    __syncwarp();
  }
}

// CTAs of quant_gemm_kernel<kFp4, NI, kVecX> resident per SM (its registers decide: NI = 8 holds
// 64 accumulators per lane).
template <bool kFp4, int NI, bool kVecX>
int resident_ctas_per_sm() {
  static const int n = [] {
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, quant_gemm_kernel<kFp4, NI, kVecX>,
                                                      kWarps * 32, 0) != cudaSuccess) {
      (void)cudaGetLastError();
      blocks = 1;
    }
    return std::max(blocks, 1);
  }();
  return n;
}

template <int NI>
int resident_ctas_per_sm(bool fp4, bool vec_x) {
  if (fp4)
    return vec_x ? resident_ctas_per_sm<true, NI, true>() : resident_ctas_per_sm<true, NI, false>();
  return vec_x ? resident_ctas_per_sm<false, NI, true>() : resident_ctas_per_sm<false, NI, false>();
}

// Token tile 8·NI: the smallest that holds all m ≤ 64 tokens, so the weights stream once.
int token_tile(int m) {
  return m <= 8 ? 8 : m <= 16 ? 16 : m <= 32 ? 32 : 64;
}

int resident_ctas_per_sm(int m, bool fp4, bool vec_x) {
  switch (token_tile(m)) {
    case 8:
      return resident_ctas_per_sm<1>(fp4, vec_x);
    case 16:
      return resident_ctas_per_sm<2>(fp4, vec_x);
    case 32:
      return resident_ctas_per_sm<4>(fp4, vec_x);
    default:
      return resident_ctas_per_sm<8>(fp4, vec_x);
  }
}

// Split-K factor, at least 2 k blocks per split, at most 32.
//   m ≤ 8 (the mma kernel runs only where the decode GEMV does not apply, as for 9..16): ~32 warps
//     per SM, partial sums well under the weight bytes (s ≤ k / (64·m)).
//   m > 8: a token tile of 16..64 gives each warp's k block 2..8 times the MMA work of m ≤ 8, so
//     only resident CTAs count: too few left the H200 mostly idle (Qwen3-30B qkv at m = 64 ran
//     40 CTAs for 96 µs), and a grid just past a whole number of waves ran its last wave almost
//     empty (Llama-70B gate_up at m = 16: 448 CTAs on 396 slots). The smallest s whose grid fills
//     ≥ 90 % of its waves' slots (else the best filling), with partial sums (fp32, written once
//     and read once, L2-resident) up to ~2× the NVFP4 weight bytes (s ≤ k / (4·m)).
int splits_for(int m, int n, int k, bool fp4, bool vec_x) {
  const int n_tiles = quant_gemm_n_pad(n) / 32, k_blocks = quant_gemm_k_pad(k) / 64;
  int s = 1;
  if (m <= 8) {
    s = std::max(1, sm_count() * 32 / n_tiles);
    s = std::min(s, std::max(1, k / (64 * std::max(m, 1))));
    s = std::min(s, std::max(1, k_blocks / 2));
    return std::min(s, 32);
  }
  const int tile = token_tile(m);
  const int64_t columns = int64_t((n_tiles + kWarps - 1) / kWarps) * ((m + tile - 1) / tile);
  const int64_t slots = int64_t(sm_count()) * resident_ctas_per_sm(m, fp4, vec_x);
  const int s_max = std::min({32, std::max(1, k / (4 * m)), std::max(1, k_blocks / 2)});
  double best_fill = 0.0;
  for (int c = 1; c <= s_max; ++c) {
    const int64_t ctas = columns * c, waves = (ctas + slots - 1) / slots;
    const double fill = double(ctas) / double(waves * slots);
    if (fill > best_fill + 1e-9) {
      best_fill = fill;
      s = c;
    }
    if (fill >= 0.9) return c;
  }
  return s;
}

void validate(const QuantGemmWeight& w, const char* who) {
  const std::string name(who);
  if (w.n <= 0 || w.k <= 0 || w.k % 8 != 0)
    throw InvalidArgument(name + ": need n > 0 and k % 8 == 0, got n = " + std::to_string(w.n) +
                          ", k = " + std::to_string(w.k));
  if (w.format == WeightFormat::kNvfp4 && w.k % 16 != 0)
    throw InvalidArgument(name + ": NVFP4 needs k % 16 == 0, got k = " + std::to_string(w.k));
  if (w.format == WeightFormat::kFp8Block &&
      (w.block_n <= 0 || w.block_k <= 0 || w.block_k % 16 != 0))
    throw InvalidArgument(name + ": FP8 block needs block_n > 0 and block_k % 16 == 0, got " +
                          std::to_string(w.block_n) + " x " + std::to_string(w.block_k));
  if (w.format != WeightFormat::kFp8PerTensor && w.scales == nullptr)
    throw InvalidArgument(name + ": missing scales");
  if (w.format == WeightFormat::kNvfp4 && reinterpret_cast<uintptr_t>(w.scales) % 16 != 0)
    throw InvalidArgument(name + ": NVFP4 scale tiles must be 16-byte aligned");
}

DeviceArgs device_args(const QuantGemmParams& p) {
  const QuantGemmWeight& w = p.w;
  DeviceArgs d{};
  d.p = p;
  d.alpha = w.format == WeightFormat::kNvfp4          ? w.global_scale * 128.0f
            : w.format == WeightFormat::kFp8PerTensor ? w.global_scale
                                                      : 1.0f;
  d.row_scale =
      w.format == WeightFormat::kFp8PerChannel ? static_cast<const float*>(w.scales) : nullptr;
  d.block = w.format == WeightFormat::kFp8Block ? static_cast<const uint16_t*>(w.scales) : nullptr;
  d.block_cols = w.format == WeightFormat::kFp8Block ? (w.k + w.block_k - 1) / w.block_k : 0;
  d.k_blocks = quant_gemm_k_pad(w.k) / 64;
  d.n_tiles = quant_gemm_n_pad(w.n) / 32;
  d.splits = 1;
  return d;
}

// Activations as 16-byte vectors without bounds checks (quant_gemm_tile's kVecX).
bool vector_x(const QuantGemmParams& p) {
  return p.w.k % 64 == 0 && is_aligned16(p.x);
}

template <bool kFp4, int NI>
void launch(const DeviceArgs& d, cudaStream_t stream) {
  const dim3 grid((d.n_tiles + kWarps - 1) / kWarps, d.splits, (d.p.m + 8 * NI - 1) / (8 * NI));
  if (vector_x(d.p)) {
    launch_pdl("quant_gemm", quant_gemm_kernel<kFp4, NI, true>, grid, dim3(kWarps * 32), 0, stream,
               d);
  } else {
    launch_pdl("quant_gemm", quant_gemm_kernel<kFp4, NI, false>, grid, dim3(kWarps * 32), 0, stream,
               d);
  }
}

template <bool kFp4>
void launch_tiles(const DeviceArgs& d, cudaStream_t stream) {
  switch (token_tile(d.p.m)) {
    case 8:
      launch<kFp4, 1>(d, stream);
      break;
    case 16:
      launch<kFp4, 2>(d, stream);
      break;
    case 32:
      launch<kFp4, 4>(d, stream);
      break;
    default:
      launch<kFp4, 8>(d, stream);
  }
}

}  // namespace

size_t quant_gemm_workspace_bytes(int m, int n, int k) {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  int s = 1;  // the most any format and activation alignment may take
  for (bool fp4 : {false, true})
    for (bool vec_x : {false, true}) s = std::max(s, splits_for(m, n, k, fp4, vec_x));
  return s > 1 ? size_t(s) * m * n * sizeof(float) : 0;
}

// 1 ≤ m ≤ 16: the decode GEMV (quant_gemv.cu) where it supports the weight, else the mma kernel.
void quant_gemm(const QuantGemmParams& p, cudaStream_t stream) {
  validate(p.w, "quant_gemm");
  if (p.m >= 1 && quant_gemv_supported(p)) {
    quant_gemv(p, stream);
    return;
  }
  quant_gemm_mma(p, stream);
}

void quant_gemm_mma(const QuantGemmParams& p, cudaStream_t stream) {
  validate(p.w, "quant_gemm");
  if (p.swiglu)
    throw InvalidArgument("quant_gemm: the SwiGLU epilogue needs the decode GEMV (m <= " +
                          std::to_string(kQuantGemvMaxM) + ", n % 32 == 0, no bias, bf16 out)");
  if (p.m <= 0) return;
  if (!is_aligned16(p.w.data) || (reinterpret_cast<uintptr_t>(p.x) & 3u) != 0)
    throw InvalidArgument("quant_gemm: weight data must be 16-byte and x 4-byte aligned");
  DeviceArgs d = device_args(p);
  d.splits = splits_for(p.m, p.w.n, p.w.k, p.w.format == WeightFormat::kNvfp4, vector_x(p));
  const int tile = token_tile(p.m);
  const int64_t columns = int64_t((d.n_tiles + kWarps - 1) / kWarps) * ((p.m + tile - 1) / tile);
  // The last CTA of a column sums 32·kWarps rows × the token tile alone: quick for 8 tokens, a
  // long serial tail for 64, where the separate grid-wide reduce is faster.
  d.fused_reduce = columns <= kMaxCounterCtas && tile == 8;
  if (d.splits > 1 && p.workspace_bytes < quant_gemm_workspace_bytes(p.m, p.w.n, p.w.k))
    throw InvalidArgument("quant_gemm: workspace too small (" + std::to_string(p.workspace_bytes) +
                          " < " + std::to_string(quant_gemm_workspace_bytes(p.m, p.w.n, p.w.k)) +
                          ")");
  if (p.w.format == WeightFormat::kNvfp4) {
    launch_tiles<true>(d, stream);
  } else {
    launch_tiles<false>(d, stream);
  }
  check_launch("quant_gemm");
  if (d.splits > 1 && !d.fused_reduce) {
    const size_t total = size_t(p.m) * p.w.n;
    const int blocks = int(std::min<size_t>((total + 255) / 256, size_t(sm_count()) * 8));
    launch_pdl("quant_gemm_reduce", quant_gemm_reduce, dim3(blocks), dim3(256), 0, stream, d);
  }
}

void quant_dequant_bf16(const QuantGemmWeight& w, bf16* out, cudaStream_t stream) {
  validate(w, "quant_dequant_bf16");
  QuantGemmParams p{};
  p.w = w;
  if (!is_aligned16(w.data) || !is_aligned16(out))
    throw InvalidArgument("quant_dequant_bf16: weight data and output must be 16-byte aligned");
  const DeviceArgs d = device_args(p);
  const int64_t tiles = int64_t(d.n_tiles) * d.k_blocks;
  // Up to 4 tiles per warp (the next tile's loads overlap the current tile's stores).
  const int64_t want = (tiles + 4 * kDequantWarps - 1) / (4 * kDequantWarps);
  const unsigned blocks =
      unsigned(std::max<int64_t>(1, std::min<int64_t>(want, int64_t(sm_count()) * 64)));
  auto* o = reinterpret_cast<__nv_bfloat16*>(out);
  if (w.format == WeightFormat::kNvfp4) {
    dequant_kernel<true><<<blocks, kDequantWarps * 32, 0, stream>>>(d, o);
  } else {
    dequant_kernel<false><<<blocks, kDequantWarps * 32, 0, stream>>>(d, o);
  }
  check_launch("quant_dequant_bf16");
}

}  // namespace serval::kernels::cuda
