// Grouped swap-AB GEMMs on mma.sync m16n8k16 (bf16 → fp32) with a cp.async pipeline, and the
// finalize kernel. See moe_gemm.h for the contract.
#include "kernels/cuda/moe/moe_gemm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "base/env.h"
#include "base/error.h"
#include "kernels/cuda/gemm/quant_fragment.cuh"
#include "kernels/cuda/misc/cp_async.cuh"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/misc/smem_opt_in.h"
#include "kernels/cuda/moe/moe_gemm_tile.cuh"
#include "kernels/cuda/moe/moe_gemm_wgmma.h"
#include "kernels/cuda/moe/nvfp4_fragment.cuh"
#include "kernels/moe_fp8_layout.h"

namespace serval::kernels::cuda {

namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kBK = 64;  // K per pipeline stage: 8 chunks of 16 B per smem row
// The latency tile-8 GEMMs shrink the weight-row tile until the worst-case grid has at least
// this many CTAs per SM (decode: 1 token gives GEMM1 only 12·9 CTAs at 128 rows).
constexpr int kMinCtasPerSm = 2;
// The 128-row NVFP4 tile-8 GEMMs split K over two warp groups while their worst-case grid has at
// most this many CTAs per SM (moe_gemm_k_groups). Qwen3-30B NVFP4 on the H200, TPOT with both
// GEMMs split vs neither (the larger grid, GEMM2's, in CTAs per SM): b8 (8.7) −5 %, b10 (10.9)
// −1 %, b12 (13.1) even; GEMM1 alone split: b16 (13.1) +0.4 %, b32 (14.5) +1 %.
constexpr int kKSplitMaxCtasPerSm = 12;

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* smem) {
  unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(s));
}

// D(16×8) += A(16×16, row-major) · B(16×8, col-major).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The barrier of one K group's pipeline (moe_gemm_kernel): the whole CTA when there is one group,
// else the group's own named barrier (1 + kw), or __syncwarp for one-warp groups.
template <int WARPS_K, int kGroupThreads>
__device__ __forceinline__ void group_barrier(int kw) {
  if constexpr (WARPS_K == 1) {
    __syncthreads();
  } else if constexpr (kGroupThreads == 32) {
    __syncwarp();
  } else {
    asm volatile("bar.sync %0, %1;\n" ::"r"(1 + kw), "r"(kGroupThreads) : "memory");
  }
}

// Element offset of 16-byte chunk `chunk` (0..7) of smem row `row`: rows are kBK elements and
// chunks are XOR-swizzled by row % 8, so the 8 rows one ldmatrix reads hit distinct banks.
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * kBK + ((chunk ^ (row & 7)) << 3);
}

// Shared-memory bytes of one pipeline stage's A tile of BM weight rows: bf16 BM × kBK swizzled;
// NVFP4 BM/16 fragments × (512 code + 64 scale bytes); FP8 BM/16 fragments × 1024 code bytes,
// then BM/16 × 8 bytes of block-scale multipliers (4 bf16 per fragment, one per k16 step).
template <MoeWeightFormat kFmt>
constexpr int a_stage_bytes(int bm) {
  if constexpr (kFmt == MoeWeightFormat::kNvfp4) return bm * (kBK / 2 + kBK / 16);
  if constexpr (kFmt == MoeWeightFormat::kFp8) return bm * kBK + bm / 16 * 8;
  return bm * kBK * 2;
}

// Block tile: BM = 32·WARPS_M weight rows × BN = 8·NI·WARPS_N tokens. Warp (wm, wn) owns
// tile rows [32·wm, 32·wm + 32) as two m16 fragments and NI n8 fragments of tokens.
// GEMM1 row mapping: fragment 0 of warp wm = gate rows of channels ch0 + 16·wm + [0, 16),
// fragment 1 = the up rows of the same channels (ch0 = blockIdx.x · BM/2), so a thread's
// accumulators of fragment 0 and 1 hold gate and up of the same (channel, token).
// Shared memory per stage: the A tile (a_stage_bytes, in the repacked order for NVFP4 and FP8)
// and the B tile (BN × kBK swizzled bf16); NVFP4 adds a 256-entry table e4m3 byte → bf16x2 of
// 2⁶⁴·scale at the end.
// WARPS_K > 1 splits K over that many groups of WARPS_M·WARPS_N warps, each with its own
// STAGES-deep pipeline over a contiguous run of K tiles and its own barrier; the groups'
// accumulators are summed in group order through shared memory before group 0's epilogue. At one
// token the tile-8 GEMMs have ~3 one-warp CTAs per SM, and a lone warp issuing every copy, barrier
// and mma of its 32 K tiles is what bounds them (ncu: 0.15 eligible warps per scheduler). The
// NVFP4 128-row tile-8 GEMMs at ~8 tokens are bound the same way (ncu, Qwen3 GEMM1: 209 warp
// instructions per K tile, issue 41 % busy, and the same 39-40 µs for 432 or 624 working CTAs):
// two K groups there (moe_gemm_k_groups).
template <int WARPS_M, int WARPS_N, int NI, int STAGES, bool kGemm1, MoeWeightFormat kFmt,
          int WARPS_K>
__global__ void __launch_bounds__(WARPS_M* WARPS_N* WARPS_K * 32) moe_gemm_kernel(MoeGemmParams p) {
  constexpr bool kFp4 = kFmt == MoeWeightFormat::kNvfp4, kFp8 = kFmt == MoeWeightFormat::kFp8;
  constexpr int kThreads = WARPS_M * WARPS_N * 32;  // per K group
  constexpr int BM = 32 * WARPS_M, BN = 8 * NI * WARPS_N;
  constexpr int kAStageBytes = a_stage_bytes<kFmt>(BM);
  // 16-byte A chunks per thread per stage (NVFP4 and FP8: codes only; NVFP4 scales use
  // kScaleChunks, FP8 multipliers one 8-byte copy per fragment).
  constexpr int kAChunks = kFp4 ? BM * 2 / kThreads : kFp8 ? BM * 4 / kThreads : BM * 8 / kThreads;
  constexpr int kBChunks = (BN * 8 + kThreads - 1) / kThreads;
  constexpr int kScaleChunks = BM / 16 * 4;  // NVFP4 scale chunks per stage (one per thread)
  static_assert(!kFp4 || (BM * 2) % kThreads == 0, "NVFP4 code chunks divide over threads");
  static_assert(!kFp8 || (BM * 4) % kThreads == 0, "FP8 code chunks divide over threads");
  static_assert(kFp4 || kFp8 || (BM * 8) % kThreads == 0, "A tile chunks divide over threads");
  static_assert(kScaleChunks <= kThreads, "one scale chunk per thread at most");

  constexpr int kGroupSmemBytes = STAGES * (kAStageBytes + BN * kBK * 2);
  extern __shared__ uint4 smem_u4[];
  const int kw = WARPS_K == 1 ? 0 : int(threadIdx.x) / kThreads;  // K group
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_u4) + kw * kGroupSmemBytes;
  __nv_bfloat16* sB = reinterpret_cast<__nv_bfloat16*>(smem + STAGES * kAStageBytes);
  // NVFP4: the scale table after every group's stages.
  uint32_t* lut =
      reinterpret_cast<uint32_t*>(reinterpret_cast<uint8_t*>(smem_u4) + WARPS_K * kGroupSmemBytes);
  const int tid = WARPS_K == 1 ? int(threadIdx.x) : int(threadIdx.x) % kThreads;
  const int lane = tid & 31, warp = tid >> 5;
  if constexpr (kFp4) {
    // Depends on nothing: built while the previous kernel drains (PDL).
    build_nvfp4_scale_table(lut);  // visible after the first barrier of the main loop
    // ... of the CTA: the groups' own barriers would not publish the other groups' entries.
    if constexpr (WARPS_K > 1) __syncthreads();
  }

  const int tile = blockIdx.y;
  const int expert = moe_tile_expert<kGemm1>(p, tile);  // the PDL protocol of both GEMMs
  if (expert < 0) return;                               // whole CTA, before any barrier

  const int wm = warp % WARPS_M, wn = warp / WARPS_M;
  const int g = lane >> 2, t4 = lane & 3;
  const int K = p.k;
  const int m_rows = kGemm1 ? 2 * p.n_out : p.n_out;
  const __nv_bfloat16* X = reinterpret_cast<const __nv_bfloat16*>(p.input);
  const int row0 = tile * BN;                                   // first permuted row of this tile
  const bool fp8_block = kFp8 && p.fp8_multipliers != nullptr;  // else 2^120 (decode_step)

  // Weight row of tile row r (GEMM1: gate/up interleaving by 16-row fragment).
  auto weight_row = [&](int r) {
    if constexpr (kGemm1) {
      const int w = r / 32, frag = (r % 32) / 16, i = r % 16;
      const int ch = blockIdx.x * (BM / 2) + w * 16 + i;
      return frag == 0 ? ch : p.n_out + ch;
    } else {
      return blockIdx.x * BM + r;
    }
  };

  // A sources. bf16: chunk column (tid % 8) is the same for all of a thread's chunks.
  // NVFP4: chunk c = tid + j·kThreads is lane c % 32 of fragment c / 32, stored at byte 16·c.
  // FP8: chunk c is 16-byte piece c % 64 of fragment c / 64's 1024-byte tile, stored at 16·c.
  const uint8_t* a_src[kAChunks];
  int a_dst[kAChunks];
  const uint8_t* s_src = nullptr;
  const uint16_t* m_src = nullptr;  // FP8 block multipliers of fragment tid (tid < BM/16)
  const int kc = tid & 7;
  if constexpr (kFp8) {
    const int kb_count = K / kBK;
    const uint8_t* Wq = static_cast<const uint8_t*>(p.weights) + size_t(expert) * m_rows * K;
#pragma unroll
    for (int j = 0; j < kAChunks; ++j) {
      const int c = tid + j * kThreads;
      const int mt = weight_row(16 * (c / 64)) / 16;
      a_src[j] = Wq + size_t(mt) * kb_count * kMoeFp8TileBytes + (c % 64) * 16;
      a_dst[j] = c * 16;
    }
    if (fp8_block && tid < BM / 16) {
      const int mt = weight_row(16 * tid) / 16;
      m_src = p.fp8_multipliers +
              (size_t(expert) * (m_rows / 16) + mt) * kb_count * kMoeFp8MultipliersPerTile;
    }
  } else if constexpr (kFp4) {
    const int kb_count = K / kBK;
    const uint8_t* Wq = static_cast<const uint8_t*>(p.weights) + size_t(expert) * m_rows * (K / 2);
#pragma unroll
    for (int j = 0; j < kAChunks; ++j) {
      const int c = tid + j * kThreads;
      const int mt = weight_row(16 * (c / 32)) / 16;
      a_src[j] = Wq + size_t(mt) * kb_count * 512 + (c % 32) * 16;
      a_dst[j] = c * 16;
    }
    if (tid < kScaleChunks) {
      const int mt = weight_row(16 * (tid / 4)) / 16;
      s_src = p.weight_scales + size_t(expert) * m_rows * (K / 16) + size_t(mt) * kb_count * 64 +
              (tid % 4) * 16;
    }
  } else {
    const uint8_t* W = static_cast<const uint8_t*>(p.weights) + size_t(expert) * m_rows * K * 2;
#pragma unroll
    for (int j = 0; j < kAChunks; ++j) {
      const int r = tid / 8 + j * (kThreads / 8);
      a_src[j] = W + (size_t(weight_row(r)) * K + kc * 8) * 2;
      a_dst[j] = swz(r, kc) * 2;
    }
  }
  const __nv_bfloat16* b_src[kBChunks];
  int b_dst[kBChunks];
  bool b_valid[kBChunks];
#pragma unroll
  for (int j = 0; j < kBChunks; ++j) {
    const int n = tid / 8 + j * (kThreads / 8);
    b_valid[j] = n < BN;
    b_dst[j] = swz(n < BN ? n : 0, kc);
    int src_row = 0;
    if (n < BN) {
      if constexpr (kGemm1) {
        const int tok = p.permuted_to_token[row0 + n];
        b_valid[j] = tok >= 0;
        src_row = tok >= 0 ? tok : 0;
      } else {
        src_row = row0 + n;
      }
    }
    b_src[j] = X + size_t(src_row) * K + kc * 8;
  }

  // Weights (A) and activations (B) of K tile kt into pipeline slot `stage`.
  auto load_a = [&](int stage, int kt) {
    uint8_t* a = smem + stage * kAStageBytes;
    // Byte offset of K tile kt in the A source: bf16 kBK·2; NVFP4 one 512-byte code tile; FP8
    // one 1024-byte tile.
    const size_t a_off = kFp4   ? size_t(kt) * 512
                         : kFp8 ? size_t(kt) * kMoeFp8TileBytes
                                : size_t(kt) * kBK * 2;
#pragma unroll
    for (int j = 0; j < kAChunks; ++j) cp_async_16(a + a_dst[j], a_src[j] + a_off, true);
    if constexpr (kFp4) {
      if (tid < kScaleChunks) cp_async_16(a + BM * (kBK / 2) + tid * 16, s_src + kt * 64, true);
    }
    if constexpr (kFp8) {
      if (m_src != nullptr)
        cp_async_8(a + BM * kBK + tid * 8, m_src + size_t(kt) * kMoeFp8MultipliersPerTile);
    }
  };
  auto load_b = [&](int stage, int kt) {
    __nv_bfloat16* b = sB + stage * BN * kBK;
    const int koff = kt * kBK;
#pragma unroll
    for (int j = 0; j < kBChunks; ++j) {
      const int n = tid / 8 + j * (kThreads / 8);
      if (n < BN) cp_async_16(b + b_dst[j], b_src[j] + koff, b_valid[j]);
    }
  };

  float acc[2][NI][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mi][ni][q] = 0.0f;

  // This K group's tiles [kt0, KT).
  const int kt0 = (K / kBK) * kw / WARPS_K, KT = (K / kBK) * (kw + 1) / WARPS_K;
  // Prologue: the weights of the first STAGES−1 K tiles, then (GEMM2: after the PDL wait) their
  // activations. Commit group s holds B of tile s (group 0 also every prologue A), so waiting
  // for group kt in the main loop still means "tile kt has landed".
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s)
    if (kt0 + s < KT) load_a(s, kt0 + s);
  if constexpr (!kGemm1) {
    pdl_wait();  // GEMM1's act is complete from here on
    pdl_launch_dependents();
  }
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (kt0 + s < KT) load_b(s, kt0 + s);
    cp_async_commit();
  }

  // Pipeline slots of K tile kt (read) and kt + STAGES − 1 (written), stepped without a modulo.
  int slot_rd = 0, slot_wr = STAGES - 1;
  auto next_slot = [](int s) { return s + 1 == STAGES ? 0 : s + 1; };
  for (int kt = kt0; kt < KT; ++kt) {
    cp_async_wait<STAGES - 2>();           // stage kt has landed (this thread's copies)
    group_barrier<WARPS_K, kThreads>(kw);  // ... and the group's; stage kt-1 is free to overwrite
    const int pre = kt + STAGES - 1;
    if (pre < KT) {
      load_a(slot_wr, pre);
      load_b(slot_wr, pre);
    }
    cp_async_commit();

    const uint8_t* a_stage = smem + slot_rd * kAStageBytes;
    const __nv_bfloat16* b = sB + slot_rd * BN * kBK;
    slot_rd = next_slot(slot_rd);
    slot_wr = next_slot(slot_wr);
    // NVFP4: this thread's codes (4 words, one per k16 step) and the 8 scale bytes of its rows
    // g and g+8, for both m16 fragments. The tile-8 kernels (NI = 1, issue-bound: each A
    // fragment feeds a single mma) share the scale lookups within each quad by shuffles; with
    // more token fragments per warp the lookups are amortized and the shuffles' latency costs
    // (tile 16-64: +1.5-6 % in the layer bench).
    constexpr bool kShareScales = kFp4 && NI == 1;
    uint4 wq[2];
    uint2 sq[2];
    QuadScales qs[2];
    // FP8: this thread's 8 code words of each m16 fragment and the fragment's 4 multipliers.
    uint32_t w8[2][8];
    uint2 mq[2] = {};
    if constexpr (kFp8) {
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        const int f = wm * 2 + mi;
        const uint8_t* tile_lane = a_stage + f * kMoeFp8TileBytes + lane * 16;
        const uint4 lo = *reinterpret_cast<const uint4*>(tile_lane);
        const uint4 hi = *reinterpret_cast<const uint4*>(tile_lane + 512);
        w8[mi][0] = lo.x, w8[mi][1] = lo.y, w8[mi][2] = lo.z, w8[mi][3] = lo.w;
        w8[mi][4] = hi.x, w8[mi][5] = hi.y, w8[mi][6] = hi.z, w8[mi][7] = hi.w;
        if (fp8_block) mq[mi] = *reinterpret_cast<const uint2*>(a_stage + BM * kBK + f * 8);
      }
    }
    if constexpr (kFp4) {
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        const int f = wm * 2 + mi;
        wq[mi] = *reinterpret_cast<const uint4*>(a_stage + (f * 32 + lane) * 16);
        sq[mi] = *reinterpret_cast<const uint2*>(a_stage + BM * (kBK / 2) + f * 64 + g * 8);
        if constexpr (kShareScales) qs[mi] = quad_scales(sq[mi], t4, lut);
      }
    }
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t af[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        if constexpr (kFp8) {
          uint32_t m = kFp8Mult;
          if (fp8_block) {
            const uint32_t h = ((kk < 2 ? mq[mi].x : mq[mi].y) >> (16 * (kk & 1))) & 0xffffu;
            m = h | (h << 16);
          }
          decode_step<false>(w8[mi], kk, m, m, af[mi]);
        } else if constexpr (kFp4) {
          const uint32_t word = kk == 0   ? wq[mi].x
                                : kk == 1 ? wq[mi].y
                                : kk == 2 ? wq[mi].z
                                          : wq[mi].w;
          if constexpr (kShareScales) {
            dequant_nvfp4_step(af[mi], word, qs[mi], kk, lane);
          } else {
            const uint32_t sb = ((kk < 2 ? sq[mi].x : sq[mi].y) >> (16 * (kk & 1))) & 0xffffu;
            dequant_nvfp4(af[mi], word, lut[sb & 0xffu], lut[sb >> 8]);
          }
        } else {
          // x4: lanes 0-15 address rows 0-15 at k 0-7, lanes 16-31 rows 0-15 at k 8-15 →
          // registers {rows 0-7 k0-7, rows 8-15 k0-7, rows 0-7 k8-15, rows 8-15 k8-15} = a0..a3.
          const __nv_bfloat16* a = reinterpret_cast<const __nv_bfloat16*>(a_stage);
          const int r = wm * 32 + mi * 16 + (lane & 15);
          ldmatrix_x4(af[mi], a + swz(r, kk * 2 + (lane >> 4)));
        }
      }
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        // x2: lanes 0-7 address tokens 0-7 at k 0-7, lanes 8-15 at k 8-15 → b0, b1
        // (smem holds [token][k], i.e. B column-major). Lanes 16-31 repeat valid addresses.
        uint32_t bfr[2];
        const int n = wn * NI * 8 + ni * 8 + (lane & 7);
        ldmatrix_x2(bfr, b + swz(n, kk * 2 + ((lane >> 3) & 1)));
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) mma_bf16(acc[mi][ni], af[mi], bfr);
      }
    }
  }
  cp_async_wait<0>();
  if constexpr (WARPS_K > 1) {
    // Groups 1.. hand their sums to group 0 through the (now idle) stages, added in group order.
    static_assert((WARPS_K - 1) * kThreads * 2 * NI * 4 * 4 <= WARPS_K * kGroupSmemBytes);
    float* red = reinterpret_cast<float*>(smem_u4);
    // Group j's accumulator (mi, ni, q) of this thread, j ≥ 1.
    auto red_at = [&](int j, int mi, int ni, int q) -> float& {
      return red[(((j - 1) * 2 * NI + mi * NI + ni) * 4 + q) * kThreads + tid];
    };
    auto each_acc = [&](auto&& f) {
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
#pragma unroll
          for (int q = 0; q < 4; ++q) f(mi, ni, q);
    };
    __syncthreads();  // every group is done with its stages
    if (kw > 0) each_acc([&](int mi, int ni, int q) { red_at(kw, mi, ni, q) = acc[mi][ni][q]; });
    __syncthreads();
    if (kw > 0) return;
    for (int j = 1; j < WARPS_K; ++j)
      each_acc([&](int mi, int ni, int q) { acc[mi][ni][q] += red_at(j, mi, ni, q); });
  }

  // Epilogue. Accumulator q of a fragment: weight row g + 8·(q / 2), token 2·t4 + q % 2.
  // Lanes g and g^1 (lane ^ 4) swap one value so that each writes two adjacent output columns
  // (channels) of one token as a bf16x2.
  const float unscale = kFp4 ? p.global_scales[expert] * kNvfp4Unscale : 1.0f;
  // FP8 per-channel / per-tensor: the scale of each weight row (this lane's row g + 8h).
  const float* rs = kFp8 && p.row_scales ? p.row_scales + size_t(expert) * m_rows : nullptr;
  const bool odd = g & 1;
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(p.output);
  constexpr int kFrags = kGemm1 ? 1 : 2;
#pragma unroll
  for (int mi = 0; mi < kFrags; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float v0, v1;  // (row g + 8h, token 2·t4) and (row g + 8h, token 2·t4 + 1)
        if constexpr (kGemm1) {
          const int ch = blockIdx.x * (BM / 2) + wm * 16 + g + 8 * h;
          const float sg = rs ? rs[ch] : unscale, su = rs ? rs[p.n_out + ch] : unscale;
          const float g0 = acc[0][ni][2 * h] * sg, g1 = acc[0][ni][2 * h + 1] * sg;
          const float u0 = acc[1][ni][2 * h] * su, u1 = acc[1][ni][2 * h + 1] * su;
          v0 = fast_silu(g0) * u0;
          v1 = fast_silu(g1) * u1;
        } else {
          const float s = rs ? rs[blockIdx.x * BM + wm * 32 + mi * 16 + g + 8 * h] : unscale;
          v0 = acc[mi][ni][2 * h] * s;
          v1 = acc[mi][ni][2 * h + 1] * s;
        }
        const float recv = __shfl_xor_sync(kFull, odd ? v0 : v1, 4);
        const int row_in = (g & ~1) + 8 * h;  // even row of the pair
        const int token = wn * NI * 8 + ni * 8 + 2 * t4 + (odd ? 1 : 0);
        const float lo = odd ? recv : v0, hi = odd ? v1 : recv;
        int col;
        if constexpr (kGemm1) {
          col = blockIdx.x * (BM / 2) + wm * 16 + row_in;
        } else {
          col = blockIdx.x * BM + wm * 32 + mi * 16 + row_in;
        }
        *reinterpret_cast<__nv_bfloat162*>(out + size_t(row0 + token) * p.n_out + col) =
            __floats2bfloat162_rn(lo, hi);
      }
}

template <int WARPS_M, int WARPS_N, int NI, int STAGES, MoeWeightFormat kFmt, int WARPS_K = 1>
void launch(const MoeGemmParams& p, cudaStream_t stream) {
  constexpr int BM = 32 * WARPS_M, BN = 8 * NI * WARPS_N;
  constexpr size_t kSmem = size_t(WARPS_K) * STAGES * (a_stage_bytes<kFmt>(BM) + BN * kBK * 2) +
                           (kFmt == MoeWeightFormat::kNvfp4 ? 1024 : 0);
  auto kernel = p.gemm1 ? moe_gemm_kernel<WARPS_M, WARPS_N, NI, STAGES, true, kFmt, WARPS_K>
                        : moe_gemm_kernel<WARPS_M, WARPS_N, NI, STAGES, false, kFmt, WARPS_K>;
  allow_dynamic_smem(kernel, kSmem, "moe_gemm");
  const int m_blocks = p.gemm1 ? p.n_out / (BM / 2) : p.n_out / BM;
  launch_pdl(p.gemm1 ? "moe_gemm1" : "moe_gemm2", kernel, dim3(m_blocks, p.max_tiles),
             dim3(WARPS_M * WARPS_N * WARPS_K * 32), kSmem, stream, p);
}

// Pipeline depth per format: NVFP4 and FP8 stages are ~4× and 2× smaller than bf16's, so more of
// them keep as many weight bytes in flight (FP8 takes NVFP4's depths: about the shared memory
// bf16 uses; not tuned yet). The 64- and 32-row tiles of the decode regime are deeper still (8
// bf16 / 12 NVFP4 stages: 72 / 40 KB of shared memory at 64 rows, 40 / 27 KB at 32), since they
// run when there are few CTAs and each must keep many bytes in flight; a whole 768-long K of
// NVFP4 is then 12 stages, i.e. issued at once. The bf16 32-row tile (one token) splits K over
// two one-warp groups of 4 stages each: Qwen3-30B bf16 b1 GEMM1 15 µs instead of 17.8 per layer,
// TPOT 2.801 vs 2.848 ms (bench/RESULTS.md; four groups make GEMM1 as fast but delay GEMM2 more).
template <MoeWeightFormat kFmt>
void dispatch(const MoeGemmParams& p, cudaStream_t stream) {
  constexpr bool kBf16 = kFmt == MoeWeightFormat::kBf16, kFp4 = kFmt == MoeWeightFormat::kNvfp4;
  constexpr int kLatStages = kBf16 ? 4 : 6, kThrStages = kBf16 ? 3 : 4;
  constexpr int kSmallStages = kBf16 ? 8 : 12;
  // Per K group: 34 KB of shared memory for two groups. Three stages measured faster than four
  // (Qwen3-30B NVFP4 b8 TPOT 4.16-4.18 vs 4.23-4.24 ms) and two slower (4.36).
  constexpr int kSplitStages = 3;
  if (p.config == MoeGemmConfig::kThroughput) {
    if (p.tile != 128) throw InvalidArgument("moe_grouped_gemm: throughput tile must be 128");
    launch<4, 2, 8, kThrStages, kFmt>(p, stream);
    return;
  }
  switch (p.tile) {
    case 8:
      switch (moe_gemm_block_rows(p)) {
        case 32:
          // bf16: two K groups of 4 stages (the same 40 KB as one warp's 8 stages).
          if constexpr (kBf16) {
            launch<1, 1, 1, 4, kFmt, 2>(p, stream);
          } else {
            launch<1, 1, 1, kSmallStages, kFmt>(p, stream);
          }
          break;
        case 64:
          launch<2, 1, 1, kSmallStages, kFmt>(p, stream);
          break;
        default:
          if constexpr (kFp4) {
            if (moe_gemm_k_groups(p) == 2) {
              launch<4, 1, 1, kSplitStages, kFmt, 2>(p, stream);
              break;
            }
          }
          launch<4, 1, 1, kLatStages, kFmt>(p, stream);
          break;
      }
      break;
    case 16:
      launch<4, 1, 2, kLatStages, kFmt>(p, stream);
      break;
    case 32:
      launch<4, 1, 4, kLatStages, kFmt>(p, stream);
      break;
    case 64:
      launch<4, 1, 8, kLatStages, kFmt>(p, stream);
      break;
    default:
      throw InvalidArgument("moe_grouped_gemm: latency tile must be 8, 16, 32 or 64, got " +
                            std::to_string(p.tile));
  }
}

}  // namespace

int moe_gemm_block_rows(const MoeGemmParams& p) {
  if (p.config != MoeGemmConfig::kLatency || p.tile != 8) return 128;
  const long target = long(kMinCtasPerSm) * sm_count();
  for (int bm : {128, 64}) {
    const long m_blocks = p.gemm1 ? p.n_out / (bm / 2) : p.n_out / bm;
    if (m_blocks * p.max_tiles >= target) return bm;
  }
  return 32;
}

int moe_gemm_k_groups(const MoeGemmParams& p) {
  if (p.config != MoeGemmConfig::kLatency || p.tile != 8 || p.format != MoeWeightFormat::kNvfp4 ||
      moe_gemm_block_rows(p) != 128)
    return 1;
  static const int forced = env_int("SERVAL_MOE_TILE8_KSPLIT", 0, 2, 0);
  if (forced > 0) return forced;
  const long m_blocks = p.gemm1 ? p.n_out / 64 : p.n_out / 128;
  return m_blocks * p.max_tiles <= long(kKSplitMaxCtasPerSm) * sm_count() ? 2 : 1;
}

void moe_grouped_gemm(const MoeGemmParams& p, cudaStream_t stream) {
  const int m_align = p.gemm1 ? 64 : 128;
  if (p.k % kBK != 0 || p.n_out % m_align != 0 || p.k <= 0 || p.n_out <= 0)
    throw InvalidArgument("moe_grouped_gemm: need k % 64 == 0 and " +
                          std::string(p.gemm1 ? "inter % 64" : "hidden % 128") + " == 0 (got k=" +
                          std::to_string(p.k) + ", n_out=" + std::to_string(p.n_out) + ")");
  const bool fp4 = p.format == MoeWeightFormat::kNvfp4;
  if (fp4 && (p.weight_scales == nullptr || p.global_scales == nullptr))
    throw InvalidArgument("moe_grouped_gemm: NVFP4 weights need block and global scales");
  if (p.format == MoeWeightFormat::kFp8 && p.fp8_multipliers != nullptr && p.row_scales != nullptr)
    throw InvalidArgument("moe_grouped_gemm: FP8 weights take block multipliers or row scales");
  if (p.max_tiles <= 0) return;
  if (moe_grouped_gemm_wgmma(p, stream)) return;
  switch (p.format) {
    case MoeWeightFormat::kBf16:
      dispatch<MoeWeightFormat::kBf16>(p, stream);
      break;
    case MoeWeightFormat::kNvfp4:
      dispatch<MoeWeightFormat::kNvfp4>(p, stream);
      break;
    case MoeWeightFormat::kFp8:
      dispatch<MoeWeightFormat::kFp8>(p, stream);
      break;
  }
}

}  // namespace serval::kernels::cuda
