// The 16×64-tile pieces of the NVFP4 expert GEMVs (moe_gemv_nvfp4.cu) on the repacked layout of
// moe_nvfp4_repack.h: weight loads, one tile's four MMAs with the activations as the B side
// (column 0 live, the others zeros), the permuted staging of activation rows in shared memory, a
// warp's walk over its down tiles and the down strip's combine. Included only by .cu files.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/moe/nvfp4_fragment.cuh"

namespace serval::kernels::cuda::gemv_tile {

__device__ __forceinline__ uint2 ld_nc8(const uint8_t* p) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// One 16×64 tile into acc (16 rows × 8 identical columns): codes `w` (this lane's 16 bytes),
// scales `s` (bytes 8g .. 8g+7 of the tile's 64: byte 2·kk + h is row g + 8h, k16 step kk),
// activation fragments b01 (steps 0, 1: b0, b1 each) and b23 (steps 2, 3).
__device__ __forceinline__ void mma_tile(float (&acc)[4], const uint4& w, const uint2& s,
                                         const uint4& b01, const uint4& b23, const uint32_t* lut) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  const uint32_t b[8] = {b01.x, b01.y, b01.z, b01.w, b23.x, b23.y, b23.z, b23.w};
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint32_t sb = ((kk < 2 ? s.x : s.y) >> (16 * (kk & 1))) & 0xffffu;
    uint32_t a[4];
    dequant_nvfp4(a, words[kk], lut[sb & 0xffu], lut[sb >> 8]);
    mma_bf16_m16n8k16(acc, a, b[2 * kk], b[2 * kk + 1]);
  }
}

// Copies `rows` rows of `cols` bf16 (cols % 64 == 0; row r from global src_row(r), 16-byte
// aligned) into shared `dst` (row r from word r·cols/2) with every 64-column chunk permuted: word
// (bf16 pair) i of 16-byte piece m of chunk kb goes to word 32·kb + 8·i + m % 8 of its row, so
// lane t4 finds its MMA B words (columns 16·kk + 2·t4 (+1) and 16·kk + 8 + 2·t4 (+1), kk = 0..3)
// at words 32·kb + 8·t4 + [0, 8) in (kk, b0/b1) order. Threads first, first + stride, ... take the
// pieces of all rows in turn, four loaded before any is stored, so that their L2 round trips
// overlap (a loop with the stores in it waits for each load in turn).
template <typename SrcRow>
__device__ __forceinline__ void stage_permuted(uint32_t* dst, SrcRow src_row, int rows, int cols,
                                               int first, int stride) {
  constexpr int kBatch = 4;
  const int row_pieces = cols / 8, pieces = rows * row_pieces;
  for (int m0 = first; m0 < pieces; m0 += kBatch * stride) {
    uint4 v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int m = m0 + j * stride;
      if (m < pieces) {
        const int r = m / row_pieces;
        const uint4* piece = reinterpret_cast<const uint4*>(src_row(r) + 8 * (m - r * row_pieces));
        v[j] = *piece;
      }
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int m = m0 + j * stride;
      if (m >= pieces) break;
      const int r = m / row_pieces, q = m - r * row_pieces;
      uint32_t* d = dst + r * (cols / 2) + 32 * (q / 8) + (q % 8);
      d[0] = v[j].x;
      d[8] = v[j].y;
      d[16] = v[j].z;
      d[24] = v[j].w;
    }
  }
}

// Activation fragments of chunk kb for lane t4 (see stage_permuted).
__device__ __forceinline__ void load_b(const uint32_t* staged, int kb, int t4, uint4& b01,
                                       uint4& b23) {
  const uint4* p = reinterpret_cast<const uint4*>(staged + 32 * kb + 8 * t4);
  b01 = p[0];
  b23 = p[1];
}

// 32 zero words after the staged activations, read as B by the lanes of columns ≥ 1, whose
// results are not used: zeros toggle fewer tensor-core bits than copies of the activations (the
// GPU decodes at its power cap; see g_zero_row in quant_gemv.cu). Written before the barrier that
// publishes the staging.
constexpr size_t kZeroBytes = 128;
__device__ __forceinline__ void zero_words(uint32_t* z) {
  if (threadIdx.x < 32) z[threadIdx.x] = 0u;
}

// A warp's walk over its down tiles q = c·KT + kb, q from q0 on (KT = inter/64 tiles per choice,
// choices in order): c and kb of the current tile.
struct DownTileWalk {
  int c, kb, KT;
  __device__ __forceinline__ DownTileWalk(int q0, int KT_)
      : c(KT_ > 0 ? q0 / KT_ : 0), kb(KT_ > 0 ? q0 % KT_ : 0), KT(KT_) {}
  __device__ __forceinline__ void advance() {
    if (++kb == KT) {
      kb = 0;
      ++c;
    }
  }
  // After the current tile's MMAs into acc: when it is choice c's last tile or the warp's last
  // (`last_of_range`), lanes t4 = 0 store rows g and g + 8 of acc as the warp's partial
  // part[c][warp][16] (the layout combine_down_strip reads) and acc is cleared; then the next tile.
  template <int kWarps>
  __device__ __forceinline__ void end_tile(float (&acc)[4], bool last_of_range, float* part,
                                           int warp, int lane) {
    if (kb + 1 == KT || last_of_range) {
      if ((lane & 3) == 0) {
        part[(c * kWarps + warp) * 16 + (lane >> 2)] = acc[0];
        part[(c * kWarps + warp) * 16 + (lane >> 2) + 8] = acc[2];
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[r] = 0.0f;
    }
    advance();
  }
};

// The down stage's epilogue for one 16-row output strip, called by every thread of the CTA after
// its warps stored their partials part[c][w][16] (c < n_local choices, w < kWarps; warp w covered
// tiles [w·N/W, (w+1)·N/W) of the N = n_local·KT, in choice order). Per choice: the partials of
// the warps whose range meets it, in warp order, unscaled by down_global[expert_of[c]] and
// rounded to bf16 into ys[c][16] (as the grouped GEMM2 stores y); then the finalize: out[r] =
// bf16(Σ_c weight_of(c) · ys[c][r]) in choice order, fp32. Two barriers; the first publishes part.
template <int kWarps, typename WeightOf>
__device__ __forceinline__ void combine_down_strip(const float* part, float* ys, int n_local,
                                                   int KT, const int* expert_of,
                                                   const float* down_global, WeightOf weight_of,
                                                   __nv_bfloat16* out) {
  const int tid = threadIdx.x, N = n_local * KT;
  __syncthreads();
  if (tid < 16 * n_local) {
    const int c = tid / 16, r = tid % 16;
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      const int ws = w * N / kWarps, we = (w + 1) * N / kWarps;
      if (we > ws && ws < (c + 1) * KT && we > c * KT) sum += part[(c * kWarps + w) * 16 + r];
    }
    const float unscale = down_global[expert_of[c]] * kNvfp4Unscale;
    ys[c * 16 + r] = __bfloat162float(__float2bfloat16_rn(sum * unscale));
  }
  __syncthreads();
  if (tid < 16) {
    float total = 0.0f;
    for (int c = 0; c < n_local; ++c) total = fmaf(weight_of(c), ys[c * 16 + tid], total);
    out[tid] = __float2bfloat16_rn(total);
  }
}

}  // namespace serval::kernels::cuda::gemv_tile
