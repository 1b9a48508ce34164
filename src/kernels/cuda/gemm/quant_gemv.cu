// Decode GEMV of quant_gemm (1 ≤ m ≤ 16, see quant_gemv.h) on mma.sync m16n8k16, swap-AB: the
// weights are the MMA's A side in their fragment layout, the m tokens the columns of B (the MMA
// computes all eight columns whatever m is, so 8 tokens cost what 1 does; 9..16 tokens are a
// second token block: each decoded A fragment feeds two MMAs, the decode being most of the work).
//
// Work item = (32-row tile, K split), one warp each: item i = blockIdx.x·W + warp is tile i / S,
// split i % S, and streams the k blocks [s·KB/S, (s+1)·KB/S) of its tile, a contiguous 1 KB
// (NVFP4) / 2 KB (FP8) per k block, through a ring of kRingDepth k blocks in the warp's own
// shared memory, filled by cp.async (the first ones requested before the PDL wait). Per k block
// and lane: 2 (NVFP4) / 4 (FP8) 16-byte code copies (lanes 0..7 also copy the NVFP4 128-byte
// scale tile), then the same from the ring into registers, NVFP4 4 scale words (rows g, g+8, 16+g,
// 24+g), and the 8 activation words of its B fragments, read from global memory (L1/L2-resident:
// every warp of the grid reads the same m·k·2 bytes) one k block ahead; columns ≥ k read as zero.
// Activations are not staged in shared memory, so m and k do not limit occupancy. The kernels
// take their arguments as __grid_constant__: gemv_body reads them through a reference, and
// without it the 72-register variant spilled (20 bytes of reloads per thread; Llama-70B NVFP4
// b1 TPOT 12.22–12.32 without the spill vs 12.44–12.52 ms, bench/RESULTS.md 2026-12-02).
// Why a shared-memory ring of two (measured on the H200, bench/RESULTS.md, 2026-12-02): bytes in
// flight held in registers cost 97–128 registers per thread; in shared memory 75–85, so more
// warps are resident. A deeper ring (4 or 8 k blocks) takes the shared memory that L1 needs for
// the activation rows every warp re-reads (at 8 tokens 1 KB per k block, as much as the weights):
// Llama-70B NVFP4 b8 TPOT was 8 % slower at depth 4 and 6–10 % faster at depth 2 than with
// registers; b1 −4 to −5 % at depth 2. Dequantization is quant_gemm.cu's (decode_step, nvfp4_mult
// through a shared 256-entry table, FP8 multiplier 2^120 or the bf16 block multiplier), so
// dequantized values are bit-identical to the mma kernel's.
//
// Balance (why items, not CTAs): the kernel is issue-bound, so the time is set by the SM holding
// the most weight bytes. S (any 1..16, ≥ 4 k blocks per warp) and W (1..16 warps per CTA) are
// chosen on the host by the cost model of quant_gemv_split.h so that the grid is resident in one
// wave with even bytes per SM (e.g. Llama-70B gate_up, 1792 tiles at 28 warps per SM: S = 2,
// W = 14, 256 CTAs, two on each SM but 8). S = 1
// allows any grid (several waves). The S partial sums of a tile are added in split order, whatever
// the arrival order (deterministic for a given shape and device):
//   - W % S == 0: the tile's splits are in one CTA; partials through shared memory (the old path).
//   - otherwise: each warp stores its fp32 partials [8·NB tokens × 32 rows] to its slot of the
//     device-global workspace g_gemv_partials, __threadfence, and lane 0 counts the arrival in
//     g_gemv_arrivals[tile]; the warp that arrives last reads the S slots back (L2) in split
//     order, runs the epilogue and resets the counter to 0, so the next launch (or a graph replay)
//     finds it zero. The workspace is fixed (kGemvMaxSplitItems slots, kGemvMaxSplitTiles
//     counters, ≈ 4 MB per device); larger shapes get in-CTA or single splits from the model.
//     Hence one quant_gemv at a time per device (quant_gemv.h).
//
#include "kernels/cuda/gemm/quant_gemv.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>

#include "base/error.h"
#include "kernels/cuda/gemm/quant_fragment.cuh"
#include "kernels/cuda/gemm/quant_gemv_split.h"
#include "kernels/cuda/misc/cp_async.cuh"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/misc/smem_opt_in.h"

namespace serval::kernels::cuda {

namespace {

enum Kind { kNvfp4Kind = 0, kFp8Kind = 1, kFp8BlockKind = 2 };

constexpr int kMaxWarps = kGemvMaxCtaWarps;
static_assert(kMaxWarps == 16, "__launch_bounds__ and the shared-memory cap assume 16 warps");

// Cross-CTA merge workspace (see the top of this file): one slot of 8·NB tokens × 32 rows fp32
// partials per work item, lane-major ([lane][nb][h][q], 32·NB bytes per lane), and one arrival
// counter per tile. Zero at module load; the last warp of a tile resets its counter. NB = 2 slots
// are twice as large, so at most half as many items use them.
constexpr int kSlotFloats = 8 * 32;  // per token block
constexpr int kMergeBatch = 7;  // slots loaded at once by the merging warp (8: FP8 80 → 96 regs)
__device__ float g_gemv_partials[size_t(kGemvMaxSplitItems) * kSlotFloats];
__device__ unsigned int g_gemv_arrivals[kGemvMaxSplitTiles];
// The MMAs' B columns past m read this zero row rather than copies of token m − 1: zeros toggle
// fewer tensor-core bits, and sustained decode runs at the board's 700 W cap, where less energy
// per weight is a higher SM clock (Llama-70B NVFP4 b1 sustained TPOT −0.5 %, bench/RESULTS.md
// 2026-12-03). Zero at module load, never written; rows of k ≤ 2 · kZeroRowWords use it (longer
// rows keep the copies).
constexpr int kZeroRowWords = 32768;
__device__ __align__(16) uint32_t g_zero_row[kZeroRowWords];

struct GemvArgs {
  const uint8_t* data;
  const uint8_t* nvfp4_scales;  // tiled e4m3 (quant_gemm.h), 16-byte aligned
  const uint16_t* block;        // FP8 block multipliers (bf16 bits)
  const float* row_scale;       // FP8 per-channel [n]
  const uint32_t* x;            // [m, k] bf16 pairs (k % 8 == 0)
  const __nv_bfloat16* bias;    // [n] or null
  void* y;
  bool y_f32;
  bool swiglu;  // y [m, n/2] = silu(gate) · up over the tiled gate/up rows (quant_gemm.h)
  bool x_aligned16;
  bool zero_pad;  // B columns ≥ m read g_zero_row (k ≤ 2 · kZeroRowWords)
  int m, n, k;
  int k_blocks, n_tiles;
  float alpha;
  int splits;      // S: K splits per tile
  int cta_warps;   // W: warps per CTA (work items blockIdx.x·W .. +W−1)
  bool in_cta;     // W % S == 0: every tile's splits in this CTA (shared-memory merge)
  int block_cols;  // FP8 block: ceil(k / block_k)
  int block_n;
  int kb_per_block;  // FP8 block: block_k / 64
};

// The streaming ring of a warp in shared memory: k blocks in flight (cp.async; see the top of
// this file for why two) and bytes per slot (the k block's codes of the 32-row tile, then for
// NVFP4 its 128-byte scale tile).
constexpr int kRingDepth = 2;
constexpr int ring_slot_bytes(int kind) {
  return kind == kNvfp4Kind ? 1024 + 128 : 2048;
}
constexpr int ring_bytes_per_warp(int kind) {
  return kRingDepth * ring_slot_bytes(kind);
}

// One k block of the ring as a lane reads it into registers: codes of groups h = 0, 1 and the
// multiplier data.
template <int kKind>
struct Slot {
  static constexpr int kWords = kKind == kNvfp4Kind ? 4 : 8;
  uint32_t w[2][kWords];
  uint32_t sf[kKind == kNvfp4Kind ? 4 : 1];  // NVFP4: rows g, g+8, 16+g, 24+g; block: bf16 bits
};

// Row `row`'s fp32 output from its fp32 sum: alpha, FP8 row scale, bias (quant_gemm.cu's
// store_out).
__device__ __forceinline__ float finish(const GemvArgs& a, int row, float v) {
  v *= a.alpha;
  if (a.row_scale) v *= a.row_scale[row];
  if (a.bias) v += __bfloat162float(a.bias[row]);
  return v;
}

// Final value of output (tok, row) from its fp32 sum.
__device__ __forceinline__ void store_out(const GemvArgs& a, int tok, int row, float v) {
  v = finish(a, row, v);
  const size_t i = size_t(tok) * a.n + row;
  if (a.y_f32) {
    static_cast<float*>(a.y)[i] = v;
  } else {
    static_cast<__nv_bfloat16*>(a.y)[i] = __float2bfloat16_rn(v);
  }
}

// SwiGLU epilogue: `row` is a gate row of the tiled order (row % 32 < 16), row + 16 its up row;
// output column 16·(row / 32) + row % 32 (the checkpoint's gate row index). silu as silu_mul's.
__device__ __forceinline__ void store_swiglu(const GemvArgs& a, int tok, int row, float gate_sum,
                                             float up_sum) {
  const float gate = finish(a, row, gate_sum), up = finish(a, row + 16, up_sum);
  const size_t i = size_t(tok) * (a.n / 2) + (row / 32) * 16 + row % 32;
  static_cast<__nv_bfloat16*>(a.y)[i] = __float2bfloat16_rn(gate / (1.0f + __expf(-gate)) * up);
}

// NB token blocks of 8 (m ≤ 8·NB): block nb's MMA B columns are tokens 8·nb + 0..7; each decoded
// A fragment feeds NB MMAs.
// kPlainB: x is 16-byte aligned and k % 64 == 0, so every k block of B lies wholly inside the row:
// two plain 16-byte loads per block, without the per-quarter bounds predicate, zero fill and
// alignment branch. NVFP4, one token block: 97 registers instead of 128 (and no spill), so more
// resident warps, and fewer instructions per k block in the streaming loop.
// The kernel body.
template <int kKind, int NB, bool kPlainB>
__device__ __forceinline__ void gemv_body(const GemvArgs& a) {
  constexpr bool kFp4 = kKind == kNvfp4Kind;
  constexpr int kLaneBytes = kFp4 ? 16 : 32;
  constexpr int kKbBytes = 2 * 32 * kLaneBytes;  // both groups of one k block of a tile
  constexpr int kDepth = kRingDepth;
  constexpr int kSlotBytes = ring_slot_bytes(kKind);
  extern __shared__ uint4 smem_u4[];
  uint32_t* lut = reinterpret_cast<uint32_t*>(smem_u4);  // [256] nvfp4_mult
  // Each warp's ring, kDepth slots of one k block (codes as in global memory, then the NVFP4
  // scale tile).
  static_assert(kDepth % 2 == 0, "compute's B parity is j % 2 of an unrolled slot index");
  constexpr int kRingBytes = ring_bytes_per_warp(kKind);
  uint8_t* ring = reinterpret_cast<uint8_t*>(lut + 256) + (threadIdx.x >> 5) * kRingBytes;
  // [warps][8·NB tokens][32 rows]
  float* part = reinterpret_cast<float*>(lut + 256 + (blockDim.x >> 5) * kRingBytes / 4);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int S = a.splits, item = blockIdx.x * a.cta_warps + warp;
  const int rt = item / S, split = item - rt * S;
  const bool active = rt < a.n_tiles;
  const int KB = a.k_blocks;
  const int kb0 = int(int64_t(split) * KB / S);
  const int n = active ? int(int64_t(split + 1) * KB / S) - kb0 : 0;
  if constexpr (kFp4)
    for (int i = threadIdx.x; i < 256; i += blockDim.x) lut[i] = nvfp4_mult(uint32_t(i));

  // Stream pointers (valid only when active; advanced by kDepth k blocks per ring round).
  const int rt_c = active ? rt : 0;
  const uint8_t* codes = a.data + (size_t(rt_c) * KB + kb0) * kKbBytes + lane * kLaneBytes;
  // NVFP4 scales: the k block's 128-byte tile; lane l < 8 copies bytes 16l.. into the ring (sc
  // points there), of which lane g reads bytes 16g.. (rows g, g+8, 16+g, 24+g).
  const uint8_t* sc = nullptr;
  // FP8 block: multiplier (row block of the tile, column block kb / kb_per_block).
  const uint16_t* bp = nullptr;
  int bc = 0, br = 0;  // column block and k block within it of the next load
  if constexpr (kFp4) {
    sc = a.nvfp4_scales + (size_t(rt_c) * KB + kb0) * 128 + 16 * (lane & 7);
  }
  if constexpr (kKind == kFp8BlockKind) {
    bp = a.block + size_t(rt_c * 32 / a.block_n) * a.block_cols;
    bc = kb0 / a.kb_per_block;
    br = kb0 % a.kb_per_block;
  }

  // Lane's byte offset of group h's code quarter q in a k block (global and ring alike).
  auto code_at = [&](int h, int q) { return h * 32 * kLaneBytes + 16 * q; };
  uint32_t block_mult[kDepth];  // FP8 block: the multiplier of the k block in ring slot j
  // Requests k block (round base) + j into ring slot j from the current pointers, by cp.async
  // (no registers held while in flight; the caller commits the group).
  auto load = [&](int j) {
    const uint8_t* c = codes + j * kKbBytes;
    uint8_t* slot = ring + j * kSlotBytes + lane * kLaneBytes;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int q = 0; q < Slot<kKind>::kWords / 4; ++q)
        cp_async_16(slot + code_at(h, q), c + code_at(h, q), true);
    if constexpr (kFp4) {
      if (lane < 8) cp_async_16(ring + j * kSlotBytes + kKbBytes + 16 * lane, sc + 128 * j, true);
    }
    if constexpr (kKind == kFp8BlockKind) {
      const uint32_t hb = __ldg(bp + bc);
      block_mult[j] = hb | (hb << 16);
      if (++br == a.kb_per_block) {
        br = 0;
        ++bc;
      }
    }
  };
  // Ring slot j in registers (its group complete: the caller waited).
  auto read_slot = [&](int j) {
    Slot<kKind> slot;
    const uint8_t* base = ring + j * kSlotBytes + lane * kLaneBytes;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int q = 0; q < Slot<kKind>::kWords / 4; ++q) {
        const uint4 v = *reinterpret_cast<const uint4*>(base + code_at(h, q));
        slot.w[h][4 * q] = v.x;
        slot.w[h][4 * q + 1] = v.y;
        slot.w[h][4 * q + 2] = v.z;
        slot.w[h][4 * q + 3] = v.w;
      }
    if constexpr (kFp4) {
      const uint4 v = *reinterpret_cast<const uint4*>(ring + j * kSlotBytes + kKbBytes + 16 * g);
      slot.sf[0] = v.x;
      slot.sf[1] = v.y;
      slot.sf[2] = v.z;
      slot.sf[3] = v.w;
    }
    if constexpr (kKind == kFp8BlockKind) slot.sf[0] = block_mult[j];
    return slot;
  };
  auto advance = [&]() {
    codes += kDepth * kKbBytes;
    if constexpr (kFp4) sc += 128 * kDepth;
  };

  // The ring's first kDepth k blocks, requested before the PDL wait (one commit group each, empty
  // past n, so that group b is always the b-th committed).
#pragma unroll
  for (int j = 0; j < kDepth; ++j) {
    if (j < n) load(j);
    cp_async_commit();
  }
  advance();

  __syncthreads();  // scale table built

  // B fragments of lane (g, t) in token block nb: token 8·nb + g; tokens ≥ m read g_zero_row (or
  // token m − 1 when the row is longer: MMA columns are independent, tokens ≥ m never stored).
  // k16 step s takes words 8t + 2s and 8t + 2s + 1 of the k block's 32 (the permuted columns of
  // quant_gemm.h): 32 consecutive bytes, two 16-byte loads when x is 16-byte aligned. k % 8 == 0,
  // so each 4-word quarter is wholly inside the row or wholly past it.
  const uint32_t* xl[NB];
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
    xl[nb] = a.zero_pad && 8 * nb + g >= a.m
                 ? g_zero_row + 32 * size_t(kb0) + 8 * t
                 : a.x + size_t(min(8 * nb + g, a.m - 1)) * (a.k / 2) + 32 * size_t(kb0) + 8 * t;
  const int words = a.k / 2;  // valid words of a token row
  auto load_b = [&](int i, uint32_t(&b)[NB][8]) {
    const int left = words - 32 * (kb0 + i) - 8 * t;  // valid words from a row's k block i on
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      const uint32_t* p = xl[nb] + 32 * i;
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        uint4 v = make_uint4(0, 0, 0, 0);
        if constexpr (kPlainB) {
          v = __ldg(reinterpret_cast<const uint4*>(p) + q);
        } else if (4 * q < left) {
          if (a.x_aligned16) {
            v = __ldg(reinterpret_cast<const uint4*>(p) + q);
          } else {
            v = make_uint4(__ldg(p + 4 * q), __ldg(p + 4 * q + 1), __ldg(p + 4 * q + 2),
                           __ldg(p + 4 * q + 3));
          }
        }
        b[nb][4 * q] = v.x;
        b[nb][4 * q + 1] = v.y;
        b[nb][4 * q + 2] = v.z;
        b[nb][4 * q + 3] = v.w;
      }
    }
  };
  pdl_wait();  // x comes from the previous kernel
  pdl_launch_dependents();
  uint32_t bq[2][NB][8];  // B of k blocks i and i + 1, in bq[i % 2] and bq[(i + 1) % 2]
  if (n > 0) load_b(0, bq[0]);

  float acc[2][NB][4] = {};
  // k block i (parity par = i % 2, a constant once the callers' loops are unrolled: i is an
  // unrolled j plus a multiple of the even kDepth): B of i + 1 requested first, then the MMAs.
  auto compute = [&](const Slot<kKind>& slot, int i, int par) {
    if (i + 1 < n) load_b(i + 1, bq[par ^ 1]);
    const uint32_t(&b)[NB][8] = bq[par];
    // Lane t's columns lie in scale group 4kb + t in every step: one multiplier pair per h.
    uint32_t m_lo[2], m_hi[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if constexpr (kFp4) {
        m_lo[h] = lut[(slot.sf[2 * h] >> (8 * t)) & 0xFFu];
        m_hi[h] = lut[(slot.sf[2 * h + 1] >> (8 * t)) & 0xFFu];
      } else if constexpr (kKind == kFp8BlockKind) {
        m_lo[h] = m_hi[h] = slot.sf[0];
      } else {
        m_lo[h] = m_hi[h] = kFp8Mult;
      }
    }
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t av[4];
        decode_step<kFp4>(slot.w[h], s, m_lo[h], m_hi[h], av);
#pragma unroll
        for (int nb = 0; nb < NB; ++nb)
          mma_bf16_m16n8k16(acc[h][nb], av, b[nb][2 * s], b[nb][2 * s + 1]);
      }
  };

  // k block i from ring slot j, then the slot refilled with block i + kDepth when `refill`.
  // Waits for the slot's group (the kDepth − 1 after it may still fly), and refills only once
  // every lane has read it; one commit per step, empty or not, keeps the group count in step.
  auto step = [&](int j, int i, bool refill) {
    cp_async_wait<kDepth - 1>();
    __syncwarp();
    compute(read_slot(j), i, j & 1);
    __syncwarp();
    if (refill) load(j);
    cp_async_commit();
  };
  int i = 0;
  // Steady state: every refill is in range (tiles i + kDepth + j < n).
  for (; i + 2 * kDepth <= n; i += kDepth) {
#pragma unroll
    for (int j = 0; j < kDepth; ++j) step(j, i + j, true);
    advance();
  }
  // Tail: fewer than 2·kDepth k blocks left.
#pragma unroll
  for (int j = 0; j < kDepth; ++j)
    if (i + j < n) step(j, i + j, i + kDepth + j < n);
#pragma unroll
  for (int j = 0; j < kDepth; ++j)
    if (i + kDepth + j < n) step(j, i + kDepth + j, false);

  // Accumulator q of group h, block nb: row 16h + g + 8·(q / 2), token 8·nb + 2t + q % 2 (with
  // swiglu, group 0 holds the tile's gate rows and group 1 their up rows, so v[0][nb][q] and
  // v[1][nb][q] pair up).
  auto store_tile = [&](const float(&v)[2][NB][4]) {
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      if (a.swiglu) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int tok = 8 * nb + 2 * t + (q & 1);
          if (tok < a.m) store_swiglu(a, tok, rt * 32 + g + 8 * (q >> 1), v[0][nb][q], v[1][nb][q]);
        }
        continue;
      }
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int row = rt * 32 + 16 * h + g + 8 * (q >> 1), tok = 8 * nb + 2 * t + (q & 1);
          if (row < a.n && tok < a.m) store_out(a, tok, row, v[h][nb][q]);
        }
    }
  };
  constexpr int kTokens = 8 * NB;  // token columns of a warp's partials
  if (S == 1) {
    if (active && 2 * t < a.m) store_tile(acc);
    return;
  }
  if (a.in_cta) {
    // The CTA's T = W / S tiles: partials through shared memory, added in split order.
    if (2 * t < a.m) {
#pragma unroll
      for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int q = 0; q < 4; ++q)
            part[(warp * kTokens + 8 * nb + 2 * t + (q & 1)) * 32 + 16 * h + g + 8 * (q >> 1)] =
                acc[h][nb][q];
    }
    __syncthreads();
    const int T = a.cta_warps / S;
    if (a.swiglu) {
      const int per_tile = a.m * 16;  // (token, gate row) pairs
      for (int idx = threadIdx.x; idx < T * per_tile; idx += blockDim.x) {
        const int ti = idx / per_tile, tok = (idx % per_tile) / 16, r = idx % 16;
        const int tile = blockIdx.x * T + ti;
        if (tile >= a.n_tiles) continue;
        float gate = 0.0f, up = 0.0f;
        for (int s = 0; s < S; ++s) {
          gate += part[((ti * S + s) * kTokens + tok) * 32 + r];
          up += part[((ti * S + s) * kTokens + tok) * 32 + r + 16];
        }
        store_swiglu(a, tok, tile * 32 + r, gate, up);
      }
      return;
    }
    const int per_tile = a.m * 32;
    for (int idx = threadIdx.x; idx < T * per_tile; idx += blockDim.x) {
      const int ti = idx / per_tile, tok = (idx % per_tile) / 32, r = idx % 32;
      const int row = (blockIdx.x * T + ti) * 32 + r;
      if (row >= a.n) continue;
      float v = 0.0f;
      for (int s = 0; s < S; ++s) v += part[((ti * S + s) * kTokens + tok) * 32 + r];
      store_out(a, tok, row, v);
    }
    return;
  }
  // Cross-CTA: partials to the item's slot (lane-major, 2·NB 16-byte stores per lane), then the
  // tile's arrival; the last of its S warps adds the S slots in split order and stores.
  if (!active) return;
  const bool lane_used = 2 * t < a.m;  // lanes whose tokens 2t, 2t + 1 include one < m
  constexpr int kSlot = kSlotFloats * NB;
  if (lane_used) {
    float4* slot =
        reinterpret_cast<float4*>(g_gemv_partials + size_t(item) * kSlot) + 2 * NB * lane;
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        __stcg(slot + 2 * nb + h,
               make_float4(acc[h][nb][0], acc[h][nb][1], acc[h][nb][2], acc[h][nb][3]));
  }
  __syncwarp();  // every lane's partials before lane 0's arrival, which releases them
  unsigned arrived = 0;
  if (lane == 0) arrived = arrive_acq_rel(&g_gemv_arrivals[rt]);
  arrived = __shfl_sync(0xffffffffu, arrived, 0);
  if (arrived != unsigned(S - 1)) return;
  __syncwarp();  // lane 0 acquired the other splits' partials: every lane reads after it
  if (lane == 0) g_gemv_arrivals[rt] = 0;  // zero again for the next launch (or graph replay)
  if (!lane_used) return;
  const float4* slots =
      reinterpret_cast<const float4*>(g_gemv_partials + size_t(rt) * S * kSlot) + 2 * NB * lane;
  float v[2][NB][4] = {};
  // kMergeBatch / NB slots' loads in flight at once.
  constexpr int kBatch = kMergeBatch / NB;
  for (int s0 = 0; s0 < S; s0 += kBatch) {
    float4 p[kBatch][NB][2];
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      if (s0 + j < S) {
#pragma unroll
        for (int nb = 0; nb < NB; ++nb)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            p[j][nb][h] = __ldcg(slots + size_t(s0 + j) * (kSlot / 4) + 2 * nb + h);
      }
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      if (s0 + j < S) {
#pragma unroll
        for (int nb = 0; nb < NB; ++nb)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            v[h][nb][0] += p[j][nb][h].x;
            v[h][nb][1] += p[j][nb][h].y;
            v[h][nb][2] += p[j][nb][h].z;
            v[h][nb][3] += p[j][nb][h].w;
          }
      }
  }
  store_tile(v);
}

template <int kKind, int NB, bool kPlainB>
__global__ void __launch_bounds__(kMaxWarps * 32)
    quant_gemv_kernel(const __grid_constant__ GemvArgs a) {
  gemv_body<kKind, NB, kPlainB>(a);
}

// The one-token-block plain variant capped at 72 registers (75–78 uncapped): 28 warps per SM
// instead of 25, which lets the split model run big weights in two K splits in one wave (Llama-70B
// gate_up, 1792 tiles: S = 2 needs 3584 resident warps, 27.2 per SM). __maxnreg__ excludes
// __launch_bounds__; the launches stay at ≤ kMaxWarps · 32 threads (72 · 512 fits an SM's 64 K).
template <int kKind>
__global__ void __maxnreg__(72) quant_gemv_kernel_72(const __grid_constant__ GemvArgs a) {
  gemv_body<kKind, 1, true>(a);
}

// The kernel of a variant (kCapped: quant_gemv_kernel_72).
template <int kKind, int NB, bool kPlainB, bool kCapped>
constexpr auto gemv_kernel() {
  static_assert(!kCapped || (NB == 1 && kPlainB));
  if constexpr (kCapped)
    return quant_gemv_kernel_72<kKind>;
  else
    return quant_gemv_kernel<kKind, NB, kPlainB>;
}

// Whether the plain one-block launches take quant_gemv_kernel_72 (SERVAL_GEMV_MAXNREG72=0: the
// uncapped kernel, for A/B runs).
bool capped_registers() {
  static const bool on = [] {
    const char* env = std::getenv("SERVAL_GEMV_MAXNREG72");
    return env == nullptr || std::string(env) != "0";
  }();
  return on;
}

// Scale table, the warps' rings, plus the partial sums of 8·NB tokens × 32 rows per warp for the
// shared-memory merge.
size_t smem_bytes(int kind, int warps, int nb, bool smem_merge) {
  return 1024 + size_t(warps) * ring_bytes_per_warp(kind) +
         (smem_merge ? size_t(warps) * nb * 256 * 4 : 0);
}

constexpr size_t smem_cap(int kind, int nb) {
  return 1024 + size_t(kMaxWarps) * ring_bytes_per_warp(kind) + size_t(kMaxWarps) * nb * 256 * 4;
}

int kind_of(const QuantGemmWeight& w) {
  return w.format == WeightFormat::kNvfp4      ? kNvfp4Kind
         : w.format == WeightFormat::kFp8Block ? kFp8BlockKind
                                               : kFp8Kind;
}

// Warps of a kernel variant resident per SM (register-limited; one-warp CTAs with the scale
// table), queried once (the split model needs it on every eager launch). Also makes the kernel's
// shared-memory opt-in on the current device.
template <int kKind, int NB, bool kPlainB, bool kCapped>
int resident_warps_per_sm() {
  auto kernel = gemv_kernel<kKind, NB, kPlainB, kCapped>();
  allow_dynamic_smem(kernel, smem_cap(kKind, NB), "quant_gemv");
  static const int warps = [kernel] {
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &per_sm, kernel, 32, smem_bytes(kKind, 1, NB, false)) != cudaSuccess) {
      (void)cudaGetLastError();
      per_sm = 1;
    }
    return std::max(per_sm, 1);
  }();
  return warps;
}

// The SERVAL_GEMV_SPLIT choice for this shape (quant_gemv_split.h), if any; InvalidArgument if the
// variable is malformed or names a choice that gemv_split_cost does not allow here.
std::optional<GemvSplit> forced_split(int n_tiles, int k_blocks, int sms, int warps,
                                      int max_items) {
  static const std::vector<GemvSplitOverride> overrides = [] {
    const char* env = std::getenv("SERVAL_GEMV_SPLIT");
    try {
      return parse_gemv_split_overrides(env ? env : "");
    } catch (const std::invalid_argument& e) {
      throw InvalidArgument(e.what());
    }
  }();
  for (const GemvSplitOverride& o : overrides) {
    if (o.n_tiles != n_tiles || o.k_blocks != k_blocks) continue;
    const GemvSplit c = make_gemv_split(
        n_tiles, o.splits, o.cta_warps,
        gemv_split_cost(n_tiles, k_blocks, sms, warps, o.splits, o.cta_warps, max_items));
    if (c.cost < 0.0)
      throw InvalidArgument("SERVAL_GEMV_SPLIT: S = " + std::to_string(c.splits) +
                            ", W = " + std::to_string(c.cta_warps) + " is not allowed for " +
                            std::to_string(n_tiles) + " tiles of " + std::to_string(k_blocks) +
                            " k blocks at " + std::to_string(warps) + " resident warps per SM");
    return c;
  }
  return std::nullopt;
}

// choose_gemv_split for (n_tiles, k_blocks, sms, warps per SM), memoized in a small direct-mapped
// table per kernel (≈ 256 cost evaluations otherwise, on every eager launch). One 64-bit word per
// entry: key n_tiles (21 bits) | k_blocks (17) | sms (10) | warps (6), value S − 1 (4) | W − 1 (4).
// NB = 2 slots take twice the workspace: half as many cross-CTA items. A SERVAL_GEMV_SPLIT choice
// for the shape (forced_split) comes first.
template <int kKind, int NB>
GemvSplit cached_split(int n_tiles, int k_blocks, int sms, int warps) {
  constexpr int kEntries = 64;
  constexpr int kMaxItems = kGemvMaxSplitItems / NB;
  if (const std::optional<GemvSplit> forced =
          forced_split(n_tiles, k_blocks, sms, warps, kMaxItems))
    return *forced;
  static std::atomic<uint64_t> cache[kEntries];
  const bool fits = n_tiles < (1 << 21) && k_blocks < (1 << 17) && sms < (1 << 10) && warps < 64;
  if (!fits) return choose_gemv_split(n_tiles, k_blocks, sms, warps, kMaxItems);
  const uint64_t key = (uint64_t(n_tiles) << 33) | (uint64_t(k_blocks) << 16) |
                       (uint64_t(sms) << 6) | uint64_t(warps);  // < 2^54
  std::atomic<uint64_t>& entry = cache[(n_tiles * 31 + k_blocks) % kEntries];
  const uint64_t e = entry.load(std::memory_order_relaxed);
  if (e != 0 && (e >> 8) == key)
    return make_gemv_split(n_tiles, int((e >> 4) & 15u) + 1, int(e & 15u) + 1);
  const GemvSplit c = choose_gemv_split(n_tiles, k_blocks, sms, warps, kMaxItems);
  entry.store((key << 8) | (uint64_t(c.splits - 1) << 4) | uint64_t(c.cta_warps - 1),
              std::memory_order_relaxed);
  return c;
}

template <int kKind, int NB, bool kPlainB, bool kCapped = false>
void launch_blocks(GemvArgs a, cudaStream_t stream) {
  const int warps_per_sm = resident_warps_per_sm<kKind, NB, kPlainB, kCapped>();
  const GemvSplit c = cached_split<kKind, NB>(a.n_tiles, a.k_blocks, sm_count(), warps_per_sm);
  a.splits = c.splits;
  a.cta_warps = c.cta_warps;
  a.in_cta = c.in_cta;
  const size_t smem = smem_bytes(kKind, c.cta_warps, NB, c.splits > 1 && c.in_cta);
  launch_pdl("quant_gemv", gemv_kernel<kKind, NB, kPlainB, kCapped>(), dim3(unsigned(c.ctas)),
             dim3(c.cta_warps * 32), smem, stream, a);
}

// One token block up to 8 tokens, two up to 16.
template <int kKind>
void launch(const GemvArgs& a, cudaStream_t stream) {
  // Plain B loads for one token block only: with two, the NVFP4 kernel reached the 128-register
  // cap either way and the plain variant spilled more (measured with the ring in registers).
  if (a.m > 8) {
    launch_blocks<kKind, 2, false>(a, stream);
  } else if (a.x_aligned16 && a.k % 64 == 0) {
    if (capped_registers())
      launch_blocks<kKind, 1, true, true>(a, stream);
    else
      launch_blocks<kKind, 1, true>(a, stream);
  } else {
    launch_blocks<kKind, 1, false>(a, stream);
  }
}

}  // namespace

bool quant_gemv_supported(const QuantGemmParams& p) {
  const QuantGemmWeight& w = p.w;
  if (p.m < 1 || p.m > kQuantGemvMaxM || w.n <= 0 || w.k <= 0) return false;
  if (w.k % 8 != 0) return false;  // 16-byte quarters of B wholly inside or past k
  if (p.swiglu && (w.n % 32 != 0 || p.bias != nullptr || p.y_f32)) return false;
  if (w.format != WeightFormat::kFp8PerTensor && (reinterpret_cast<uintptr_t>(w.scales) & 3u))
    return false;
  if (w.format == WeightFormat::kNvfp4 && (reinterpret_cast<uintptr_t>(w.scales) & 15u))
    return false;  // one 16-byte scale load per lane and k block
  if (w.format == WeightFormat::kFp8Block &&
      (w.block_n <= 0 || w.block_n % 32 != 0 || w.block_k <= 0 || w.block_k % 64 != 0))
    return false;
  return true;
}

void quant_gemv(const QuantGemmParams& p, cudaStream_t stream) {
  const QuantGemmWeight& w = p.w;
  const bool has_x = p.x != nullptr && (reinterpret_cast<uintptr_t>(p.x) & 3u) == 0;
  if (!quant_gemv_supported(p) || w.data == nullptr || !has_x || p.y == nullptr ||
      (w.format != WeightFormat::kFp8PerTensor && w.scales == nullptr) || !is_aligned16(w.data))
    throw InvalidArgument("quant_gemv: need 1 <= m <= " + std::to_string(kQuantGemvMaxM) +
                          ", k % 8 == 0, 16-byte aligned weight data, 4-byte aligned x and scales, "
                          "FP8 blocks of 32k x 64k, and for SwiGLU n % 32 == 0, no bias and bf16 "
                          "out; got m = " +
                          std::to_string(p.m) + ", n = " + std::to_string(w.n) +
                          ", k = " + std::to_string(w.k));
  GemvArgs a{};
  a.data = w.data;
  a.nvfp4_scales =
      w.format == WeightFormat::kNvfp4 ? static_cast<const uint8_t*>(w.scales) : nullptr;
  a.block = w.format == WeightFormat::kFp8Block ? static_cast<const uint16_t*>(w.scales) : nullptr;
  a.row_scale =
      w.format == WeightFormat::kFp8PerChannel ? static_cast<const float*>(w.scales) : nullptr;
  a.x = reinterpret_cast<const uint32_t*>(p.x);
  a.bias = reinterpret_cast<const __nv_bfloat16*>(p.bias);
  a.y = p.y;
  a.y_f32 = p.y_f32;
  a.swiglu = p.swiglu;
  a.x_aligned16 = is_aligned16(p.x);
  a.zero_pad = w.k / 2 <= kZeroRowWords;
  a.m = p.m;
  a.n = w.n;
  a.k = w.k;
  a.k_blocks = quant_gemm_k_pad(w.k) / 64;
  a.n_tiles = quant_gemm_n_pad(w.n) / 32;
  // As quant_gemm.cu's device_args: NVFP4 values carry 2^-7, FP8 per-tensor its scale.
  a.alpha = w.format == WeightFormat::kNvfp4          ? w.global_scale * 128.0f
            : w.format == WeightFormat::kFp8PerTensor ? w.global_scale
                                                      : 1.0f;
  if (w.format == WeightFormat::kFp8Block) {
    a.block_cols = (w.k + w.block_k - 1) / w.block_k;
    a.block_n = w.block_n;
    a.kb_per_block = w.block_k / 64;
  }
  switch (kind_of(w)) {
    case kNvfp4Kind:
      launch<kNvfp4Kind>(a, stream);
      break;
    case kFp8Kind:
      launch<kFp8Kind>(a, stream);
      break;
    default:
      launch<kFp8BlockKind>(a, stream);
      break;
  }
  check_launch("quant_gemv");
}

}  // namespace serval::kernels::cuda
