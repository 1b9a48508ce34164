// Shared by the wgmma grouped-GEMM kernels (moe_gemm_wgmma*.cu): the CTA
// tile's weight rows, its gathered token rows and the epilogue. A CTA tile is kBM weight rows ×
// kBN = 128 permuted token rows; its m64 blocks are numbered 0 .. kBM/64 − 1.
#pragma once
#include <cuda_bf16.h>

#include <type_traits>

#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/mbarrier.cuh"
#include "kernels/cuda/misc/wgmma.cuh"
#include "kernels/cuda/moe/moe_gemm.h"

namespace serval::kernels::cuda::moe_wgmma {

constexpr int kBK = 64;   // K per stage: one 128-byte swizzled row per operand row
constexpr int kBN = 128;  // token rows per tile (the routing's throughput tile)

// The stage ring of the warp-specialized kernels (moe_gemm_wgmma_ws.cu, moe_gemm_wgmma_nvfp4.cu):
// 2·kStages mbarriers at shared address `bars`. full(s) completes once all 128 producer threads'
// copies of stage s have landed, empty(s) once both consumer warpgroups are done with it.
template <int kStages>
struct StageRing {
  uint32_t bars;
  __device__ __forceinline__ uint32_t full(int s) const { return bars + 8 * s; }
  __device__ __forceinline__ uint32_t empty(int s) const { return bars + 8 * (kStages + s); }
  // Producer: waits until stage use `it` (every kStages-th use shares a slot) may refill its
  // slot, i.e. both consumers released the slot's previous use; returns the slot.
  __device__ __forceinline__ int wait_empty(int it) const {
    const int s = it % kStages;
    if (it >= kStages) mbarrier::wait(empty(s), uint32_t(it / kStages - 1) & 1);
    return s;
  }
  // Consumer: waits until the copies of stage use `it` have landed; returns the slot.
  __device__ __forceinline__ int wait_full(int it) const {
    const int s = it % kStages;
    mbarrier::wait(full(s), uint32_t(it / kStages) & 1);
    return s;
  }
  // One thread of the CTA, before the CTA barrier that publishes the mbarriers.
  __device__ __forceinline__ void init() const {
    for (int s = 0; s < kStages; ++s) {
      mbarrier::init(full(s), 128);
      mbarrier::init(empty(s), 2);
    }
  }
};

// Weight row (of the expert's [m_rows, K] matrix) of row r of weight block m_block (kBM rows).
// GEMM1: 16-row slice r / 16 holds the gate rows (0-7) then the up rows (8-15) of 8 channels, so
// that a thread's accumulator rows g and g + 8 are gate and up of one channel.
template <bool kGemm1, int kBM>
__device__ __forceinline__ int weight_row(const MoeGemmParams& p, int m_block, int r) {
  if constexpr (kGemm1) {
    const int ch = m_block * (kBM / 2) + (r / 16) * 8 + r % 8;
    return r % 16 < 8 ? ch : p.n_out + ch;
  } else {
    return m_block * kBM + r;
  }
}

// Source row of token tile row r (tile starting at permuted row row0): GEMM1 gathers x rows
// through permuted_to_token (−1: a zero row, `valid` false), GEMM2 reads act rows in order.
template <bool kGemm1>
__device__ __forceinline__ const __nv_bfloat16* token_row(const MoeGemmParams& p, int row0, int r,
                                                          bool& valid) {
  const __nv_bfloat16* x = reinterpret_cast<const __nv_bfloat16*>(p.input);
  valid = true;
  int src = row0 + r;
  if constexpr (kGemm1) {
    const int tok = p.permuted_to_token[row0 + r];
    valid = tok >= 0;
    src = tok >= 0 ? tok : 0;
  }
  return x + size_t(src) * p.k;
}

// Token rows of the tile at permuted row row0 that hold tokens, as the wgmma width that covers
// them: 32, 64 or kBN. The routing pads each expert's rows at their end (permuted_to_token −1),
// so the valid rows are a prefix of every tile.
__device__ __forceinline__ int tile_width(const MoeGemmParams& p, int row0) {
  if (p.permuted_to_token[row0 + 32] < 0) return 32;
  if (p.permuted_to_token[row0 + 64] < 0) return 64;
  return kBN;
}

// A producer thread's token rows r0 + 16j (j < kBN / 16) of the tile at permuted row row0, from
// 16-byte chunk column kc: their sources in src, and as the result bit j whether row j is copied.
// Rows without a token are zero-filled, and so are rows at or past the tile's width when
// `narrow` (tile_width: nothing reads them, and GEMM1 does not write them for GEMM2).
template <bool kGemm1>
__device__ __forceinline__ uint32_t token_sources(const MoeGemmParams& p, int row0, int r0, int kc,
                                                  bool narrow,
                                                  const __nv_bfloat16* (&src)[kBN / 16]) {
  const int width = narrow ? tile_width(p, row0) : kBN;
  uint32_t copied = 0;
#pragma unroll
  for (int j = 0; j < kBN / 16; ++j) {
    bool valid;
    src[j] = token_row<kGemm1>(p, row0, r0 + 16 * j, valid) + kc * 8;
    if (r0 + 16 * j >= width) valid = false;
    copied |= uint32_t(valid) << j;
  }
  return copied;
}

// Calls run(std::integral_constant<int, kN>{}) with kN the wgmma width of the tile at permuted
// row row0 (tile_width when `narrow`, else kBN): one instantiation per width, each a straight run
// of wgmma (ptxas serializes wgmma it cannot prove warpgroup-uniform).
template <class Run>
__device__ __forceinline__ void with_tile_width(const MoeGemmParams& p, int row0, bool narrow,
                                                Run&& run) {
  const int width = narrow ? tile_width(p, row0) : kBN;
  if (width == 32) {
    run(std::integral_constant<int, 32>{});
  } else if (width == 64) {
    run(std::integral_constant<int, 64>{});
  } else {
    run(std::integral_constant<int, kBN>{});
  }
}

// The wgmma of one 64-wide k stage, as one committed group: kMb m64 blocks of A (kMb·64 rows
// of 128 bytes from shared address a) times the first kN token rows of the tile B (from b), both
// SW128. acc[mb][j] for j < kN / 8 only.
template <int kMb, int kN = kBN>
__device__ __forceinline__ void mma_stage(float (&acc)[kMb][kBN / 8][4], uint32_t a, uint32_t b) {
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < kBK / 16; ++kk)
#pragma unroll
    for (int mb = 0; mb < kMb; ++mb) {
      const uint64_t da = wgmma::sw128_desc(a + mb * 64 * 128 + kk * 32, 16, 1024);
      const uint64_t db = wgmma::sw128_desc(b + kk * 32, 16, 1024);
      if constexpr (kN == 32) {
        wgmma::wgmma_m64n32k16_ss(reinterpret_cast<float(&)[4][4]>(acc[mb]), da, db, 1);
      } else if constexpr (kN == 64) {
        wgmma::wgmma_m64n64k16_ss(reinterpret_cast<float(&)[8][4]>(acc[mb]), da, db, 1);
      } else {
        static_assert(kN == kBN, "token widths 32, 64 and 128");
        wgmma::wgmma_m64n128k16_ss(acc[mb], da, db, 1);
      }
    }
  wgmma::commit();
}

// Epilogue of kMb m64 accumulators (their first kN tokens), m64 blocks first_block.. of the tile
// of weight block m_block and token rows row0.. (warp wq of the
// warpgroup, lane = 4g + t4). acc[mb][j][q]: tile row 64·(first_block + mb) + 16·wq + g +
// 8·(q / 2), token 8j + 2·t4 + q % 2. GEMM1 writes silu(gate)·up, GEMM2 the rows. Lanes g and
// g^1 (lane ^ 4) swap one value so that each writes two adjacent output columns of one token.
template <bool kGemm1, int kBM, int kMb, int kN = kBN>
__device__ __forceinline__ void store_tile(const MoeGemmParams& p,
                                           const float (&acc)[kMb][kBN / 8][4], int m_block,
                                           int row0, int first_block, int wq, int lane) {
  const int g = lane >> 2, t4 = lane & 3;
  const bool odd = g & 1;
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(p.output);
  constexpr int kHalves = kGemm1 ? 1 : 2;
#pragma unroll
  for (int mb = 0; mb < kMb; ++mb) {
    const int block = first_block + mb;
#pragma unroll
    for (int j = 0; j < kN / 8; ++j)
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
        float v0, v1;  // (row g (+8h), token 2·t4) and (row g (+8h), token 2·t4 + 1)
        if constexpr (kGemm1) {
          const float g0 = acc[mb][j][0], g1 = acc[mb][j][1];
          v0 = fast_silu(g0) * acc[mb][j][2];
          v1 = fast_silu(g1) * acc[mb][j][3];
        } else {
          v0 = acc[mb][j][2 * h];
          v1 = acc[mb][j][2 * h + 1];
        }
        const float recv = __shfl_xor_sync(0xffffffffu, odd ? v0 : v1, 4);
        const int token = 8 * j + 2 * t4 + (odd ? 1 : 0);
        const float lo = odd ? recv : v0, hi = odd ? v1 : recv;
        const int col = kGemm1 ? m_block * (kBM / 2) + block * 32 + wq * 8 + (g & ~1)
                               : m_block * kBM + block * 64 + wq * 16 + (g & ~1) + 8 * h;
        *reinterpret_cast<__nv_bfloat162*>(out + size_t(row0 + token) * p.n_out + col) =
            __floats2bfloat162_rn(lo, hi);
      }
  }
}

}  // namespace serval::kernels::cuda::moe_wgmma
