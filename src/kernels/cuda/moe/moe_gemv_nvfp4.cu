// NVFP4 MoE expert GEMVs for a few tokens (see moe_gemv_nvfp4.h) on mma.sync m16n8k16.
//
// The repacked layout stores each 16-row strip of a weight as K/64 consecutive tiles of 512 code
// bytes + 64 scale bytes (moe_nvfp4_repack.h); one 16-byte load gives a lane its A fragments of a
// tile's four k16 MMAs and one 8-byte load their block scales. A warp streams a contiguous run of
// tiles of one strip through a register ring (kDepth or kFewTokenGateUpRing tiles in flight),
// dequantizes them exactly as the grouped GEMM does (dequant_nvfp4 of nvfp4_fragment.cuh: bf16
// e2m1·scale·2⁻⁶²) and multiplies them with the token's activations as the MMA's B side: B column 0
// holds the activation vector and the other columns zeros, so column 0 of the accumulator (lanes t4
// = 0) is the result. The K range of a strip is split over the warps of a CTA (partial sums in
// shared memory, added in warp order), so that at one token the whole layer's weights are in flight
// at once.
//   gate_up: CTA = (pair, 16 channels): the gate strip and the matching up strip (rows
//            inter + 16·mt ...) share the activation fragments; SwiGLU in the epilogue.
//   down:    CTA = (token, 16 hidden rows): the tiles of the token's local choices (in choice
//            order) are one sequence split over the warps; per choice the partial sums are
//            unscaled and rounded to bf16, then combined with the routing weights.
// Activations are staged in shared memory with each 64-column chunk permuted so that lane t4
// reads its B fragments of the chunk's four k16 steps as two 16-byte loads.
#include "kernels/cuda/moe/moe_gemv_nvfp4.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "base/error.h"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/misc/timeline_probe.h"
#include "kernels/cuda/moe/moe_gemv_nvfp4_tile.cuh"
#include "kernels/cuda/moe/moe_routing_device.cuh"
#include "kernels/cuda/moe/nvfp4_fragment.cuh"

namespace serval::kernels::cuda {

namespace {

using namespace gemv_tile;

constexpr int kDepth = 4;  // tiles in flight per warp (per strip), by default
// ... in the 2-warp gate_up of one or two tokens: 6 (128 registers). Qwen3-30B NVFP4 b1 TPOT on an
// H100, means of 2 rounds: ring 2 / 3 / 4 / 6 2.01 / 1.92 / 1.91 / 1.87 ms, in a second call 4 / 6
// 1.92 / 1.87 (b2 2.36 / 2.34); in a third 4 / 8 1.90 / 2.05 (167 registers: bulk copies lost
// likewise, bench/RESULTS.md).
constexpr int kFewTokenGateUpRing = 6;
constexpr int kMaxTopK = 8;          // choices per token the down kernel stages
constexpr int kMaxHidden = 16384;    // gate_up stages one x row: 32 KB
constexpr int kMaxActElems = 12288;  // down stages top_k · inter activations: 24 KB

// Shared memory of the gate_up kernel: scale table, partial sums [warps][gate/up][16], x row,
// zero words.
constexpr size_t gate_up_smem(int warps, int hidden) {
  return 1024 + size_t(warps) * 2 * 16 * 4 + size_t(hidden) * 2 + kZeroBytes;
}

// CTA = (pair, strip mt of 16 channels); warp w takes the K tiles [w·KT/W, (w+1)·KT/W) (KT ≥ W).
// kRoute: the pair's expert from the CTA's own routing of the token (routing::route_in_cta) instead
// of topk_ids.
template <int kWarps, bool kRoute, int kRing>
__device__ __forceinline__ void gate_up_body(const MoeGemvNvfp4Params& p, const MoeGemvRouting& r) {
  extern __shared__ uint4 smem_u4[];
  uint32_t* lut = reinterpret_cast<uint32_t*>(smem_u4);
  float* part = reinterpret_cast<float*>(lut + 256);
  uint32_t* xs = reinterpret_cast<uint32_t*>(part + kWarps * 2 * 16);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
  build_nvfp4_scale_table(lut);
  uint32_t* zeros = xs + p.hidden / 2;
  zero_words(zeros);
  const bool dead = g != 0;  // a B column whose result is not used
  const int strips = p.inter / 16;
  const int pair = blockIdx.x / strips, mt = blockIdx.x % strips;
  pdl_wait();  // the expert ids (or, kRoute, the router logits) come from the kernel before
  pdl_launch_dependents();
  const int t = pair / p.top_k;
  const __nv_bfloat16* x_row = reinterpret_cast<const __nv_bfloat16*>(p.x) + size_t(t) * p.hidden;
  auto x_of = [x_row](int) { return x_row; };
  int e;
  if constexpr (kRoute) {
    __shared__ float s_row[kMoeMaxExperts];
    __shared__ int32_t s_ids[kMoeMaxTopK];
    __shared__ float s_weights[kMoeMaxTopK];
    // Warp 0 routes the token while the other warps stage x, off the path from the routing to
    // the first weights (route_in_cta's closing barrier ends both).
    static_assert(kWarps >= 2, "the routing variant stages x with the warps after warp 0");
    if (warp > 0) stage_permuted(xs, x_of, 1, p.hidden, tid - 32, (kWarps - 1) * 32);
    routing::route_in_cta(r.logits, r.params, t, s_row, s_ids, s_weights);
    e = s_ids[pair % p.top_k] - p.local_offset;
  } else {
    e = p.topk_ids[pair] - p.local_offset;
  }
  if (e < 0 || e >= p.num_local) return;  // whole CTA, past every barrier before the loop

  const int KT = p.hidden / 64;
  const int kb0 = warp * KT / kWarps, n = (warp + 1) * KT / kWarps - kb0;
  const size_t strip_codes = size_t(KT) * 512, strip_scales = size_t(KT) * 64;
  // Gate and up strip of the same channels (the up strip is `strips` strips further), advanced
  // one tile per load: tiles are loaded in order.
  const uint8_t* gate_codes = p.gate_up_codes + size_t(e) * 2 * strips * strip_codes +
                              size_t(mt) * strip_codes + size_t(kb0) * 512 + 16 * lane;
  const uint8_t* gate_scales = p.gate_up_scales + size_t(e) * 2 * strips * strip_scales +
                               size_t(mt) * strip_scales + size_t(kb0) * 64 + 8 * g;
  const uint8_t* up_codes = gate_codes + size_t(strips) * strip_codes;
  const uint8_t* up_scales = gate_scales + size_t(strips) * strip_scales;

  uint4 wq[kRing][2];
  uint2 sq[kRing][2];
  auto load = [&](int i, int slot) {
    if (i < n) {
      wq[slot][0] = ld_stream16(gate_codes);
      wq[slot][1] = ld_stream16(up_codes);
      sq[slot][0] = ld_nc8(gate_scales);
      sq[slot][1] = ld_nc8(up_scales);
      gate_codes += 512;
      up_codes += 512;
      gate_scales += 64;
      up_scales += 64;
    }
  };
#pragma unroll
  for (int s = 0; s < kRing; ++s) load(s, s);

  if constexpr (!kRoute) {
    stage_permuted(xs, x_of, 1, p.hidden, tid, kWarps * 32);
    __syncthreads();  // x staged, scale table built
  }

  float acc[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
  for (int i0 = 0; i0 < n; i0 += kRing) {
#pragma unroll
    for (int s = 0; s < kRing; ++s) {
      const int i = i0 + s;
      if (i >= n) break;
      uint4 b01, b23;
      load_b(dead ? zeros : xs, dead ? 0 : kb0 + i, t4, b01, b23);
      mma_tile(acc[0], wq[s][0], sq[s][0], b01, b23, lut);
      mma_tile(acc[1], wq[s][1], sq[s][1], b01, b23, lut);
      load(i + kRing, s);  // the slot is free: refill it kRing tiles ahead
    }
  }
  // Column 0: acc[.][0] is row g, acc[.][2] row g + 8.
  if (t4 == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      part[(warp * 2 + h) * 16 + g] = acc[h][0];
      part[(warp * 2 + h) * 16 + g + 8] = acc[h][2];
    }
  }
  __syncthreads();
  if (tid < 16) {
    float gs = 0.0f, us = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      gs += part[(w * 2) * 16 + tid];
      us += part[(w * 2 + 1) * 16 + tid];
    }
    const float unscale = p.gate_up_global[e] * kNvfp4Unscale;
    const float gv = gs * unscale, uv = us * unscale;
    reinterpret_cast<__nv_bfloat16*>(p.act)[size_t(pair) * p.inter + mt * 16 + tid] =
        __float2bfloat16_rn(fast_silu(gv) * uv);
  }
}

template <int kWarps, int kRing>
__global__ void __launch_bounds__(kWarps * 32)
    gate_up_kernel(const __grid_constant__ MoeGemvNvfp4Params p) {
  gate_up_body<kWarps, false, kRing>(p, {});
}
template <int kWarps, int kRing>
__global__ void __launch_bounds__(kWarps * 32)
    gate_up_route_kernel(const __grid_constant__ MoeGemvNvfp4Params p,
                         const __grid_constant__ MoeGemvRouting r) {
  gate_up_body<kWarps, true, kRing>(p, r);
}

// Shared memory of the down kernel: scale table, choice list, partial sums
// [kMaxTopK][warps][16], per-choice outputs [kMaxTopK][16], staged activations [top_k][inter].
constexpr size_t kDownChoiceBytes = 2 * kMaxTopK * 4 + 16;
constexpr size_t down_smem(int warps, int top_k, int inter) {
  return 1024 + kDownChoiceBytes + size_t(kMaxTopK) * warps * 16 * 4 + kMaxTopK * 16 * 4 +
         size_t(top_k) * inter * 2 + kZeroBytes;
}

// CTA = (token t, strip hs of 16 hidden rows). The token's local choices c = 0 .. n_local − 1
// (choice order) give the tile sequence q = c·KT + kb (KT = inter/64); warp w takes
// [w·N/W, (w+1)·N/W) of the N = n_local·KT tiles and writes one partial per choice it touches.
// kRoute: ids and weights from the CTA's own routing of the token (routing::route_in_cta).
template <int kWarps, bool kRoute>
__device__ __forceinline__ void down_body(const MoeGemvNvfp4Params& p, const MoeGemvRouting& r) {
  extern __shared__ uint4 smem_u4[];
  uint32_t* lut = reinterpret_cast<uint32_t*>(smem_u4);
  int* c_expert = reinterpret_cast<int*>(lut + 256);  // local expert of choice c
  int* c_j = c_expert + kMaxTopK;                     // its index j in the token's top-k
  int* c_count = c_j + kMaxTopK;
  float* part = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(lut) + 1024 +
                                         kDownChoiceBytes);  // [c][w][16]
  float* ys = part + kMaxTopK * kWarps * 16;                 // [c][16]
  uint32_t* acts = reinterpret_cast<uint32_t*>(ys + kMaxTopK * 16);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
  build_nvfp4_scale_table(lut);
  uint32_t* zeros = acts + size_t(p.top_k) * p.inter / 2;
  zero_words(zeros);
  const bool dead = g != 0;  // a B column whose result is not used
  const int strips = p.hidden / 16;
  const int t = blockIdx.x / strips, hs = blockIdx.x % strips;
  // The ids (or, kRoute, the router logits) before the PDL wait: this grid starts only after
  // every gate_up CTA has passed its wait, so the grid that wrote them has completed; L2 loads
  // (ld.global.cg) cannot meet a stale L1 line (the argument of GEMM2 in moe_gemm.cu).
  [[maybe_unused]] float* s_weights = nullptr;
  [[maybe_unused]] int32_t* s_ids = nullptr;
  if constexpr (kRoute) {
    __shared__ float s_row[kMoeMaxExperts];
    __shared__ int32_t s_ids_[kMoeMaxTopK];
    __shared__ float s_weights_[kMoeMaxTopK];
    routing::route_in_cta(r.logits, r.params, t, s_row, s_ids_, s_weights_);
    s_ids = s_ids_;
    s_weights = s_weights_;
  }
  if (tid == 0) {
    int ids[kMaxTopK];
#pragma unroll
    for (int j = 0; j < kMaxTopK; ++j) {
      if constexpr (kRoute)
        ids[j] = j < p.top_k ? s_ids[j] - p.local_offset : -1;
      else
        ids[j] = j < p.top_k ? __ldcg(p.topk_ids + t * p.top_k + j) - p.local_offset : -1;
    }
    int count = 0;
#pragma unroll
    for (int j = 0; j < kMaxTopK; ++j)
      if (ids[j] >= 0 && ids[j] < p.num_local) {
        c_expert[count] = ids[j];
        c_j[count] = j;
        ++count;
      }
    *c_count = count;
  }
  __syncthreads();
  const int n_local = *c_count;
  const int KT = p.inter / 64, N = n_local * KT;
  const int q0 = warp * N / kWarps, n = (warp + 1) * N / kWarps - q0;
  const size_t strip_codes = size_t(KT) * 512, strip_scales = size_t(KT) * 64;
  const size_t expert_codes = size_t(strips) * strip_codes,
               expert_scales = size_t(strips) * strip_scales;
  const uint8_t* codes = p.down_codes + size_t(hs) * strip_codes + 16 * lane;
  const uint8_t* scales = p.down_scales + size_t(hs) * strip_scales + 8 * g;

  uint4 wq[kDepth];
  uint2 sq[kDepth];
  DownTileWalk next(q0, KT);  // the next tile to load
  auto load = [&](int i, int slot) {
    if (i < n) {
      const int ex = c_expert[next.c];
      wq[slot] = ld_stream16(codes + size_t(ex) * expert_codes + size_t(next.kb) * 512);
      sq[slot] = ld_nc8(scales + size_t(ex) * expert_scales + size_t(next.kb) * 64);
      next.advance();
    }
  };
#pragma unroll
  for (int s = 0; s < kDepth; ++s) load(s, s);

  pdl_wait();  // act from the gate_up kernel
  pdl_launch_dependents();
  const __nv_bfloat16* act = reinterpret_cast<const __nv_bfloat16*>(p.act);
  auto act_of = [&](int c) { return act + size_t(t * p.top_k + c_j[c]) * p.inter; };
  stage_permuted(acts, act_of, n_local, p.inter, tid, kWarps * 32);
  __syncthreads();  // activations staged

  float acc[4] = {0, 0, 0, 0};
  DownTileWalk cur(q0, KT);  // the tile being multiplied
  for (int i0 = 0; i0 < n; i0 += kDepth) {
#pragma unroll
    for (int s = 0; s < kDepth; ++s) {
      const int i = i0 + s;
      if (i >= n) break;
      uint4 b01, b23;
      load_b(dead ? zeros : acts + size_t(cur.c) * (p.inter / 2), dead ? 0 : cur.kb, t4, b01, b23);
      mma_tile(acc, wq[s], sq[s], b01, b23, lut);
      cur.end_tile<kWarps>(acc, i + 1 == n, part, warp, lane);
      load(i + kDepth, s);
    }
  }
  combine_down_strip<kWarps>(
      part, ys, n_local, KT, c_expert, p.down_global,
      [&](int c) {
        if constexpr (kRoute)
          return s_weights[c_j[c]];
        else
          return p.topk_weights[t * p.top_k + c_j[c]];
      },
      reinterpret_cast<__nv_bfloat16*>(p.out) + size_t(t) * p.hidden + hs * 16);
}

template <int kWarps>
__global__ void __launch_bounds__(kWarps * 32)
    down_kernel(const __grid_constant__ MoeGemvNvfp4Params p) {
  down_body<kWarps, false>(p, {});
}
template <int kWarps>
__global__ void __launch_bounds__(kWarps * 32)
    down_route_kernel(const __grid_constant__ MoeGemvNvfp4Params p,
                      const __grid_constant__ MoeGemvRouting r) {
  down_body<kWarps, true>(p, r);
}

// Resident CTAs per SM of `kernel` at `threads` and `smem`, cached per kernel and smem size
// (the query costs host time every eager step otherwise).
template <typename Kernel>
int ctas_per_sm(Kernel kernel, int threads, size_t smem, std::atomic<uint64_t>& cache) {
  const uint64_t key = uint64_t(smem + 1) << 32;
  const uint64_t cached = cache.load(std::memory_order_relaxed);
  if ((cached & ~0xffffffffull) == key) return int(cached & 0xffffffffu);
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    per_sm = 1;
  }
  per_sm = per_sm > 0 ? per_sm : 1;
  cache.store(key | uint64_t(per_sm), std::memory_order_relaxed);
  return per_sm;
}

// The two kernels of a stage (plain and routing variants), their shared memory and name.
template <int kRing>
struct GateUpStageOf {
  template <int W>
  static constexpr auto plain = gate_up_kernel<W, kRing>;
  template <int W>
  static constexpr auto routed = gate_up_route_kernel<W, kRing>;
  static constexpr const char* kName = "moe_gemv_nvfp4_gate_up";
  static size_t smem(int warps, const MoeGemvNvfp4Params& p) {
    return gate_up_smem(warps, p.hidden);
  }
  static bool has_work(int warps, const MoeGemvNvfp4Params& p) {
    return p.hidden / 64 >= warps;  // every warp a K tile
  }
};
struct DownStage {
  template <int W>
  static constexpr auto plain = down_kernel<W>;
  template <int W>
  static constexpr auto routed = down_route_kernel<W>;
  static constexpr const char* kName = "moe_gemv_nvfp4_down";
  static size_t smem(int warps, const MoeGemvNvfp4Params& p) {
    return down_smem(warps, p.top_k, p.inter);
  }
  static bool has_work(int, const MoeGemvNvfp4Params&) { return true; }
};
using GateUpStage = GateUpStageOf<kDepth>;

// Launches stage `Stage` with W warps per CTA (the routing variant when `route`) and returns true
// when `force` or when all `ctas` CTAs are resident at once and every warp has work; false
// (nothing launched) otherwise.
template <typename Stage, int W>
bool run_stage(const MoeGemvNvfp4Params& p, const MoeGemvRouting* route, long ctas, bool force,
               cudaStream_t stream) {
  static std::atomic<uint64_t> cache{0}, route_cache{0};
  const size_t smem = Stage::smem(W, p);
  if (!force) {
    const int per_sm = route ? ctas_per_sm(Stage::template routed<W>, W * 32, smem, route_cache)
                             : ctas_per_sm(Stage::template plain<W>, W * 32, smem, cache);
    if (!Stage::has_work(W, p) || long(per_sm) * sm_count() < ctas) return false;
  }
  if (route)
    launch_pdl(Stage::kName, Stage::template routed<W>, dim3(unsigned(ctas)), dim3(W * 32), smem,
               stream, p, *route);
  else
    launch_pdl(Stage::kName, Stage::template plain<W>, dim3(unsigned(ctas)), dim3(W * 32), smem,
               stream, p);
  return true;
}

}  // namespace

bool moe_gemv_nvfp4_supported(int num_tokens, int top_k, int hidden, int inter) {
  return num_tokens >= 1 && num_tokens <= kMoeGemvMaxTokens && top_k >= 1 && top_k <= kMaxTopK &&
         hidden > 0 && hidden % 64 == 0 && hidden <= kMaxHidden && inter > 0 && inter % 64 == 0 &&
         long(top_k) * inter <= kMaxActElems;
}

void moe_gemv_nvfp4(const MoeGemvNvfp4Params& p, cudaStream_t stream, const MoeGemvRouting* route) {
  const bool routing = route ? route->logits && route->params.num_experts >= 1 &&
                                   route->params.num_experts <= kMoeMaxExperts &&
                                   route->params.top_k == p.top_k &&
                                   route->params.num_tokens == p.num_tokens
                             : p.topk_ids && p.topk_weights;
  const bool pointers = p.x && p.gate_up_codes && p.gate_up_scales && p.gate_up_global &&
                        p.down_codes && p.down_scales && p.down_global && routing && p.act && p.out;
  if (!moe_gemv_nvfp4_supported(p.num_tokens, p.top_k, p.hidden, p.inter) || !pointers ||
      !is_aligned16(p.x) || !is_aligned16(p.gate_up_codes) || !is_aligned16(p.gate_up_scales) ||
      !is_aligned16(p.down_codes) || !is_aligned16(p.down_scales) || !is_aligned16(p.act))
    throw InvalidArgument(
        "moe_gemv_nvfp4: need 1 <= tokens <= " + std::to_string(kMoeGemvMaxTokens) +
        ", 1 <= top_k <= " + std::to_string(kMaxTopK) +
        ", hidden and inter multiples of 64, hidden <= 16384, top_k·inter <= "
        "12288, non-null 16-byte aligned buffers (routing in the kernels: at most " +
        std::to_string(kMoeMaxExperts) + " experts, the GEMVs' tokens and top_k); got " +
        std::to_string(p.num_tokens) + " tokens, top_k " + std::to_string(p.top_k) + ", hidden " +
        std::to_string(p.hidden) + ", inter " + std::to_string(p.inter));
  // Warps per CTA. One or two tokens: 2-warp gate_up CTAs (each warp a longer K range), which
  // leave room on every SM for the 16-warp down CTAs to be resident early and request their first
  // weights while gate_up runs (Qwen3-30B NVFP4 on the H200, 2 rounds side by side: batch-1 TPOT
  // 2.267 ms vs 2.297-2.304 with 8 and 32 warps, batch 2 2.675 vs 2.691; batch 4 3.816 vs 3.598,
  // so more tokens keep the rule below). Otherwise K is split over as many warps as keep every
  // CTA resident at once (one token: the whole layer's weights in flight).
  const bool few = p.num_tokens <= 2;
  const long gate_up_ctas = long(p.num_tokens) * p.top_k * (p.inter / 16);
  if (few)
    run_stage<GateUpStageOf<kFewTokenGateUpRing>, 2>(p, route, gate_up_ctas, true, stream);
  else if (!run_stage<GateUpStage, 8>(p, route, gate_up_ctas, false, stream) &&
           !run_stage<GateUpStage, 4>(p, route, gate_up_ctas, false, stream))
    run_stage<GateUpStage, 2>(p, route, gate_up_ctas, true, stream);
  timeline_mark("moe gate_up", stream);
  const long down_ctas = long(p.num_tokens) * (p.hidden / 16);
  if (few && run_stage<DownStage, 16>(p, route, down_ctas, false, stream)) return;
  if (!run_stage<DownStage, 32>(p, route, down_ctas, false, stream) &&
      !run_stage<DownStage, 16>(p, route, down_ctas, false, stream))
    run_stage<DownStage, 8>(p, route, down_ctas, true, stream);
}

}  // namespace serval::kernels::cuda
