// One-token NVFP4 MoE block in one persistent launch (see moe_one_token_nvfp4.h).
//
// CTA of 16 warps. Threads 0-255 run the norm + router phase with the thread → column assignment
// of moe_norm_router.cu (thread i owns columns 8i .. 8i + 7: one 16-byte chunk, hidden ≤ 2048),
// so x and the logits are the same bits. The gate_up and down phases use the tile pieces of
// moe_gemv_nvfp4_tile.cuh (one 16×64 tile per MMA group, dequantized as the grouped GEMM does).
//
// Grid barriers: thread 0 of each CTA arrives on a counter with release semantics (after a
// __syncthreads, so the CTA's stores are covered) and spins with acquire loads until all G CTAs
// have arrived; a __syncthreads then releases the CTA. Every CTA arrives on a third counter when
// it has passed both barriers; the last one resets all three for the next launch (which starts
// only after this grid has completed: it waits on the kernels between).
#include "kernels/cuda/moe/moe_one_token_nvfp4.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>

#include "base/error.h"
#include "kernels/cuda/gemm/row_stream.cuh"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/misc/smem_opt_in.h"
#include "kernels/cuda/moe/moe_gemv_nvfp4_tile.cuh"
#include "kernels/cuda/moe/moe_routing_device.cuh"
#include "kernels/cuda/moe/nvfp4_fragment.cuh"

namespace serval::kernels::cuda {

namespace {

using namespace gemv_tile;

constexpr int kNormThreads = 256;  // the norm + router phase: moe_norm_router.cu's CTA
constexpr int kNormWarps = kNormThreads / 32;
constexpr int kMaxHidden = 8 * kNormThreads;  // one 16-byte chunk per norm thread
constexpr int kMaxRouterRows = 2;             // router rows per CTA
constexpr int kMaxGateStrips = 4;             // gate_up strips per CTA
constexpr int kMaxTopK = 8;
constexpr int kRing = 6;  // gate_up tile pairs in flight per warp (Qwen3-30B: all of its 6)

// Arrivals: logits stored, activations stored, CTAs done. Zero at module load; reset by the last
// CTA of each launch.
__device__ unsigned int g_one_token_sync[3];

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// %globaltimer into phase_ns[CTA][phase] when profiling (thread 0).
__device__ __forceinline__ void stamp(unsigned long long* phase_ns, int phase) {
  if (phase_ns == nullptr || threadIdx.x != 0) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  phase_ns[blockIdx.x * kMoeOneTokenPhases + phase] = t;
}

// Grid-wide barrier on `counter` (all threads of every CTA; see the top of the file).
__device__ __forceinline__ void grid_barrier(unsigned* counter) {
  __syncthreads();
  if (threadIdx.x == 0) {
    arrive_acq_rel(counter);
    while (ld_acquire(counter) < gridDim.x) {
    }
  }
  __syncthreads();
}

__device__ __forceinline__ void cp_async16(void* smem, const void* global) {
  const uint32_t dst = uint32_t(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global) : "memory");
}

// Byte offsets of the dynamic shared memory pieces.
struct SmemLayout {
  size_t lut, xs, zeros, acts, gate_part, down_part, ys, down_codes, down_scales, total;
};

__host__ __device__ constexpr size_t align16(size_t n) {
  return (n + 15) / 16 * 16;
}

__host__ __device__ inline SmemLayout smem_layout(int hidden, int inter, int top_k, int warps) {
  SmemLayout l{};
  size_t off = 0;
  auto take = [&off](size_t bytes) {
    const size_t at = off;
    off += align16(bytes);
    return at;
  };
  const size_t tiles = size_t(top_k) * (inter / 64);  // down tiles of one output strip
  l.lut = take(256 * 4);
  l.xs = take(size_t(hidden) * 2);
  l.zeros = take(kZeroBytes);
  l.acts = take(size_t(top_k) * inter * 2);
  l.gate_part = take(size_t(kMaxGateStrips) * warps * 2 * 16 * 4);  // [strip][warp][gate/up][16]
  l.down_part = take(size_t(kMaxTopK) * warps * 16 * 4);            // [choice][warp][16]
  l.ys = take(size_t(kMaxTopK) * 16 * 4);                           // [choice][16]
  l.down_codes = take(tiles * 512);
  l.down_scales = take(tiles * 64);
  l.total = off;
  return l;
}

// A gate_up strip of this CTA: local expert, 16-channel strip, choice (pair) index.
struct GateStrip {
  int expert, mt, pair;
};

// R router rows per CTA, kWarps warps (kWarps · 32 ≥ kNormThreads).
template <int R, int kWarps>
__global__ void __launch_bounds__(kWarps * 32, 1)
    one_token_kernel(const __grid_constant__ MoeOneTokenNvfp4Params p) {
  extern __shared__ uint4 smem_u4[];
  __shared__ float s_sq[kNormWarps];
  __shared__ float s_dot[kNormWarps][R];
  __shared__ float s_row[kMoeMaxExperts];
  __shared__ int32_t s_ids[kMoeMaxTopK];
  __shared__ float s_weights[kMoeMaxTopK];
  __shared__ GateStrip s_strips[kMaxGateStrips];
  __shared__ int s_choice_expert[kMaxTopK], s_choice_j[kMaxTopK], s_counts[2];

  const MoeNormRouterParams& nr = p.norm_router;
  const MoeGemvNvfp4Params& ex = p.experts;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
  const int H = nr.hidden, E = nr.routing.num_experts, I = ex.inter, top_k = ex.top_k;
  constexpr int kThreads = kWarps * 32;
  static_assert(kThreads >= kNormThreads, "the norm phase needs kNormThreads threads");
  const SmemLayout L = smem_layout(H, I, top_k, kWarps);
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_u4);
  uint32_t* lut = reinterpret_cast<uint32_t*>(smem + L.lut);
  uint32_t* xs = reinterpret_cast<uint32_t*>(smem + L.xs);
  uint32_t* zeros = reinterpret_cast<uint32_t*>(smem + L.zeros);
  uint32_t* acts = reinterpret_cast<uint32_t*>(smem + L.acts);
  float* gate_part = reinterpret_cast<float*>(smem + L.gate_part);
  float* down_part = reinterpret_cast<float*>(smem + L.down_part);
  float* ys = reinterpret_cast<float*>(smem + L.ys);
  uint8_t* down_codes = smem + L.down_codes;
  uint8_t* down_scales = smem + L.down_scales;
  stamp(p.phase_ns, 0);
  build_nvfp4_scale_table(lut);
  zero_words(zeros);
  const bool dead = g != 0;  // a B column whose result is not used

  // ---- Phase 1: add + norm + router rows (threads < kNormThreads own chunk `vec`) -------------
  const int vec = tid, num_vecs = H / 8, row0 = blockIdx.x * R;
  const bool owns_chunk = tid < kNormThreads && vec < num_vecs;
  uint4 wr[R];
  float nw[8];
#pragma unroll
  for (int r = 0; r < R; ++r)
    wr[r] = owns_chunk && row0 + r < E
                ? ld_stream16(reinterpret_cast<const __nv_bfloat16*>(nr.router) +
                              size_t(row0 + r) * H + vec * 8)
                : make_uint4(0, 0, 0, 0);
  if (owns_chunk) load8(reinterpret_cast<const __nv_bfloat16*>(nr.norm_weight) + vec * 8, nw);
  pdl_wait();  // h and the residual come from the kernels before
  stamp(p.phase_ns, 1);

  __nv_bfloat16* residual = reinterpret_cast<__nv_bfloat16*>(nr.residual);
  float v[8];
  float sum_sq = 0.0f;
  if (owns_chunk) {
    float rv[8];
    load8(reinterpret_cast<const __nv_bfloat16*>(nr.h) + vec * 8, v);
    load8(residual + vec * 8, rv);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      v[j] += rv[j];
      sum_sq += v[j] * v[j];
      v[j] = __bfloat162float(__float2bfloat16_rn(v[j]));  // the stored residual
    }
  }
  sum_sq = warp_sum(sum_sq);
  if (lane == 0 && warp < kNormWarps) s_sq[warp] = sum_sq;
  __syncthreads();
  const float inv = rsqrtf(warp_sum(lane < kNormWarps ? s_sq[lane] : 0.0f) / float(H) + nr.eps);
  float acc_r[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc_r[r] = 0.0f;
  if (owns_chunk) {
    float xv[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) xv[j] = __bfloat162float(__float2bfloat16_rn(v[j] * inv * nw[j]));
    if (blockIdx.x == 0) store8(reinterpret_cast<__nv_bfloat16*>(nr.x) + vec * 8, xv);
    // x staged for the gate_up MMAs in stage_permuted's layout: piece `vec`, word i at 8·i.
    uint32_t* d = xs + 32 * (vec / 8) + vec % 8;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(xv[2 * i], xv[2 * i + 1]);
      d[8 * i] = *reinterpret_cast<const uint32_t*>(&pair);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) acc_r[r] = dot8_bf16(wr[r], xv, acc_r[r]);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float sum = warp_sum(acc_r[r]);
    if (lane == 0 && warp < kNormWarps) s_dot[warp][r] = sum;
  }
  __syncthreads();
  if (tid < R && row0 + tid < E) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kNormWarps; ++w) sum += s_dot[w][tid];
    nr.logits[row0 + tid] = sum;
  }
  grid_barrier(&g_one_token_sync[0]);  // every logit stored, every CTA past its residual loads
  stamp(p.phase_ns, 2);
  if (blockIdx.x == 0 && owns_chunk) store8(residual + vec * 8, v);

  // ---- Phase 2: routing, gate_up + SwiGLU; the down tiles copied in meanwhile ----------------
  MoeRoutingParams rp = nr.routing;
  rp.num_tokens = 1;
  routing::route_in_cta(nr.logits, rp, 0, s_row, s_ids, s_weights);
  const int strips_per_pair = I / 16, down_KT = I / 64;
  if (tid == 0) {
    int n = 0;
    for (int k = 0; k < kMaxGateStrips; ++k) {
      const int s = blockIdx.x + k * gridDim.x;
      if (s >= top_k * strips_per_pair) break;
      const int pair = s / strips_per_pair, e = s_ids[pair] - ex.local_offset;
      if (e >= 0 && e < ex.num_local) s_strips[n++] = {e, s % strips_per_pair, pair};
    }
    s_counts[0] = n;
    int c = 0;
    for (int j = 0; j < top_k; ++j) {
      const int e = s_ids[j] - ex.local_offset;
      if (e >= 0 && e < ex.num_local) {
        s_choice_expert[c] = e;
        s_choice_j[c] = j;
        ++c;
      }
    }
    s_counts[1] = c;
  }
  __syncthreads();
  const int n_strips = s_counts[0], n_local = s_counts[1];
  stamp(p.phase_ns, 3);

  // This warp's gate/up tile pairs: [q0, q0 + n) of the CTA's sequence q = strip·gate_KT + kb.
  const int gate_KT = H / 64;
  const int N = n_strips * gate_KT;
  const int q0 = warp * N / kWarps, n = (warp + 1) * N / kWarps - q0;
  const size_t gate_strip_codes = size_t(gate_KT) * 512, gate_strip_scales = size_t(gate_KT) * 64;
  uint4 wq[kRing][2];
  uint2 sq[kRing][2];
  int lk = gate_KT > 0 ? q0 / gate_KT : 0, lkb = gate_KT > 0 ? q0 % gate_KT : 0;  // next to load
  auto load = [&](int i, int slot) {
    if (i >= n) return;
    const GateStrip st = s_strips[lk];
    const size_t tile = size_t(st.expert) * 2 * strips_per_pair + st.mt;  // gate strip index
    const uint8_t* gc = ex.gate_up_codes + tile * gate_strip_codes + size_t(lkb) * 512 + 16 * lane;
    const uint8_t* gs = ex.gate_up_scales + tile * gate_strip_scales + size_t(lkb) * 64 + 8 * g;
    const size_t up = size_t(strips_per_pair);  // the up strip: strips_per_pair strips further
    wq[slot][0] = ld_stream16(gc);
    wq[slot][1] = ld_stream16(gc + up * gate_strip_codes);
    sq[slot][0] = ld_nc8(gs);
    sq[slot][1] = ld_nc8(gs + up * gate_strip_scales);
    if (++lkb == gate_KT) {
      lkb = 0;
      ++lk;
    }
  };
#pragma unroll
  for (int s = 0; s < kRing; ++s) load(s, s);

  // The down tiles of this CTA's output strip, choice-major, into shared memory.
  const int down_strips = H / 16, hs = blockIdx.x;
  const bool has_down = hs < down_strips;
  if (has_down) {
    const size_t strip_codes = size_t(down_KT) * 512, strip_scales = size_t(down_KT) * 64;
    const int code_pieces = int(strip_codes / 16), scale_pieces = int(strip_scales / 16);
    const int per_choice = code_pieces + scale_pieces;
    for (int m = tid; m < n_local * per_choice; m += kThreads) {
      const int c = m / per_choice, piece = m - c * per_choice;
      const size_t e = size_t(s_choice_expert[c]);
      if (piece < code_pieces)
        cp_async16(down_codes + c * strip_codes + 16 * piece,
                   ex.down_codes + (e * down_strips + hs) * strip_codes + 16 * piece);
      else
        cp_async16(
            down_scales + c * strip_scales + 16 * (piece - code_pieces),
            ex.down_scales + (e * down_strips + hs) * strip_scales + 16 * (piece - code_pieces));
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }

  {
    float acc[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
    int vk = gate_KT > 0 ? q0 / gate_KT : 0, vkb = gate_KT > 0 ? q0 % gate_KT : 0;
    for (int i0 = 0; i0 < n; i0 += kRing) {
#pragma unroll
      for (int s = 0; s < kRing; ++s) {
        const int i = i0 + s;
        if (i >= n) break;
        uint4 b01, b23;
        load_b(dead ? zeros : xs, dead ? 0 : vkb, t4, b01, b23);
        mma_tile(acc[0], wq[s][0], sq[s][0], b01, b23, lut);
        mma_tile(acc[1], wq[s][1], sq[s][1], b01, b23, lut);
        const bool strip_done = vkb + 1 == gate_KT;
        if (strip_done || i + 1 == n) {  // this warp's last tile pair of strip vk
          if (t4 == 0) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              gate_part[((vk * kWarps + warp) * 2 + h) * 16 + g] = acc[h][0];
              gate_part[((vk * kWarps + warp) * 2 + h) * 16 + g + 8] = acc[h][2];
            }
          }
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[h][r] = 0.0f;
        }
        if (strip_done) {
          vkb = 0;
          ++vk;
        } else {
          ++vkb;
        }
        load(i + kRing, s);  // the slot is free: refill it kRing tiles ahead
      }
    }
  }
  __syncthreads();
  // Per strip and channel: the partials of the warps whose range meets the strip, in warp order;
  // unscale, SwiGLU, bf16 (as gate_up_body of moe_gemv_nvfp4.cu).
  if (tid < 16 * n_strips) {
    const int k = tid / 16, r = tid % 16;
    float gs = 0.0f, us = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      const int ws = w * N / kWarps, we = (w + 1) * N / kWarps;
      if (we > ws && ws < (k + 1) * gate_KT && we > k * gate_KT) {
        gs += gate_part[((k * kWarps + w) * 2) * 16 + r];
        us += gate_part[((k * kWarps + w) * 2 + 1) * 16 + r];
      }
    }
    const GateStrip st = s_strips[k];
    const float unscale = ex.gate_up_global[st.expert] * kNvfp4Unscale;
    reinterpret_cast<__nv_bfloat16*>(ex.act)[size_t(st.pair) * I + st.mt * 16 + r] =
        __float2bfloat16_rn(fast_silu(gs * unscale) * (us * unscale));
  }
  stamp(p.phase_ns, 4);
  grid_barrier(&g_one_token_sync[1]);  // every activation stored
  stamp(p.phase_ns, 5);
  // No CTA waits on another from here: the next kernel may take free SM space.
  pdl_launch_dependents();

  // ---- Phase 3: down + the weighted combine of output rows [16·hs, 16·hs + 16) ----------------
  if (has_down) {
    const __nv_bfloat16* act = reinterpret_cast<const __nv_bfloat16*>(ex.act);
    auto act_of = [&](int c) { return act + size_t(s_choice_j[c]) * I; };
    stage_permuted<true>(acts, act_of, n_local, I, tid, kThreads);
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();  // activations staged, down tiles landed

    const int DN = n_local * down_KT;
    const int d0 = warp * DN / kWarps, dn = (warp + 1) * DN / kWarps - d0;
    float acc[4] = {0, 0, 0, 0};
    DownTileWalk cur(d0, down_KT);
    for (int i = 0; i < dn; ++i) {
      const int tile = cur.c * down_KT + cur.kb;
      const uint4 w = *reinterpret_cast<const uint4*>(down_codes + size_t(tile) * 512 + 16 * lane);
      const uint2 s = *reinterpret_cast<const uint2*>(down_scales + size_t(tile) * 64 + 8 * g);
      uint4 b01, b23;
      load_b(dead ? zeros : acts + size_t(cur.c) * (I / 2), dead ? 0 : cur.kb, t4, b01, b23);
      mma_tile(acc, w, s, b01, b23, lut);
      cur.end_tile<kWarps>(acc, i + 1 == dn, down_part, warp, lane);
    }
    combine_down_strip<kWarps>(
        down_part, ys, n_local, down_KT, s_choice_expert, ex.down_global,
        [&](int c) { return s_weights[s_choice_j[c]]; },
        reinterpret_cast<__nv_bfloat16*>(ex.out) + hs * 16);
  }

  stamp(p.phase_ns, 6);
  if (tid == 0 && arrive_acq_rel(&g_one_token_sync[2]) == gridDim.x - 1) {
    // Every CTA has passed both barriers: nobody reads the counters of this launch any more.
    g_one_token_sync[0] = 0;
    g_one_token_sync[1] = 0;
    g_one_token_sync[2] = 0;
  }
}

using Kernel = void (*)(MoeOneTokenNvfp4Params);

// CTAs of the grid: enough for every down strip (one each), gate_up strip (kMaxGateStrips each)
// and router row (kMaxRouterRows each).
int grid_ctas(const MoeOneTokenNvfp4Params& p) {
  const int E = p.norm_router.routing.num_experts;
  const int gate_strips = p.experts.top_k * (p.experts.inter / 16);
  int g = p.experts.hidden / 16;
  g = std::max(g, (gate_strips + kMaxGateStrips - 1) / kMaxGateStrips);
  return std::max(g, (E + kMaxRouterRows - 1) / kMaxRouterRows);
}

int router_rows(const MoeOneTokenNvfp4Params& p, int ctas) {
  return (p.norm_router.routing.num_experts + ctas - 1) / ctas;
}

// A compiled variant: router rows per CTA and warps per CTA.
struct Variant {
  Kernel kernel;
  int warps, slot;  // slot: its entry in fits_resident's cache
};

// Warps per CTA: 16, or 8 with SERVAL_MOE_ONE_TOKEN_WARPS=8 (an experiment: half the registers
// of an SM, so the kernels before and after can share the SMs under PDL).
int warps_per_cta() {
  static const int warps = [] {
    const char* v = std::getenv("SERVAL_MOE_ONE_TOKEN_WARPS");
    return v != nullptr && std::string(v) == "8" ? 8 : 16;
  }();
  return warps;
}

Variant pick(int rows) {
  const bool one = rows <= 1;
  if (warps_per_cta() == 8)
    return one ? Variant{one_token_kernel<1, 8>, 8, 0} : Variant{one_token_kernel<2, 8>, 8, 1};
  return one ? Variant{one_token_kernel<1, 16>, 16, 2} : Variant{one_token_kernel<2, 16>, 16, 3};
}

size_t smem_bytes(const MoeOneTokenNvfp4Params& p, const Variant& v) {
  return smem_layout(p.experts.hidden, p.experts.inter, p.experts.top_k, v.warps).total;
}

// Whether `ctas` CTAs of the variant at `smem` bytes are all resident at once on this device
// (cached per device and size: an eager decode step asks every layer).
bool fits_resident(const Variant& v, size_t smem, int ctas) {
  static std::atomic<uint64_t> cache[4]{};
  std::atomic<uint64_t>& slot = cache[v.slot];
  int device = 0;
  (void)cudaGetDevice(&device);
  const uint64_t key = (uint64_t(device) << 40) | (uint64_t(smem) << 8);
  const uint64_t cached = slot.load(std::memory_order_relaxed);
  int per_sm = 0;
  if ((cached & ~0xffull) == key) {
    per_sm = int(cached & 0xffu);
  } else {
    int optin = 0;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
            cudaSuccess ||
        size_t(optin) < smem) {
      (void)cudaGetLastError();
      return false;
    }
    allow_dynamic_smem(v.kernel, smem, "moe_one_token_nvfp4");
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, v.kernel, v.warps * 32, smem) !=
        cudaSuccess) {
      (void)cudaGetLastError();
      per_sm = 0;
    }
    slot.store(key | uint64_t(per_sm & 0xff), std::memory_order_relaxed);
  }
  return per_sm >= 1 && long(per_sm) * sm_count() >= ctas;
}

bool shapes_supported(const MoeOneTokenNvfp4Params& p) {
  const MoeNormRouterParams& nr = p.norm_router;
  const MoeGemvNvfp4Params& ex = p.experts;
  return nr.routing.num_tokens == 1 && ex.num_tokens == 1 && moe_norm_router_supported(nr) &&
         moe_gemv_nvfp4_supported(1, ex.top_k, ex.hidden, ex.inter) && ex.top_k <= kMaxTopK &&
         nr.routing.top_k == ex.top_k && nr.hidden == ex.hidden && ex.hidden <= kMaxHidden &&
         nr.routing.local_offset == ex.local_offset && nr.routing.num_local == ex.num_local &&
         long(ex.top_k) * (ex.inter / 16) <= long(kMaxGateStrips) * grid_ctas(p) &&
         router_rows(p, grid_ctas(p)) <= kMaxRouterRows;
}

}  // namespace

int moe_one_token_nvfp4_ctas(const MoeOneTokenNvfp4Params& p) {
  return grid_ctas(p);
}

bool moe_one_token_nvfp4_supported(const MoeOneTokenNvfp4Params& p) {
  if (!shapes_supported(p)) return false;
  const int ctas = grid_ctas(p);
  const Variant v = pick(router_rows(p, ctas));
  return fits_resident(v, smem_bytes(p, v), ctas);
}

void moe_one_token_nvfp4(const MoeOneTokenNvfp4Params& p, cudaStream_t stream) {
  const MoeNormRouterParams& nr = p.norm_router;
  const MoeGemvNvfp4Params& ex = p.experts;
  const bool pointers =
      nr.h && nr.residual && nr.norm_weight && nr.router && nr.x && nr.logits && ex.gate_up_codes &&
      ex.gate_up_scales && ex.gate_up_global && ex.down_codes && ex.down_scales && ex.down_global &&
      ex.act && ex.out && is_aligned16(ex.gate_up_codes) && is_aligned16(ex.gate_up_scales) &&
      is_aligned16(ex.down_codes) && is_aligned16(ex.down_scales) && is_aligned16(ex.act);
  if (!pointers || !moe_one_token_nvfp4_supported(p))
    throw InvalidArgument(
        "moe_one_token_nvfp4: need one token, hidden <= 2048 with hidden/16 CTAs resident at "
        "once, top_k <= 8, hidden and inter multiples of 64, at most 4 gate_up strips and 2 "
        "router rows per CTA, and non-null 16-byte aligned buffers (got hidden " +
        std::to_string(ex.hidden) + ", inter " + std::to_string(ex.inter) + ", top_k " +
        std::to_string(ex.top_k) + ", experts " + std::to_string(nr.routing.num_experts) + ")");
  const int ctas = grid_ctas(p);
  const Variant v = pick(router_rows(p, ctas));
  launch_pdl("moe_one_token_nvfp4", v.kernel, dim3(unsigned(ctas)), dim3(unsigned(v.warps * 32)),
             smem_bytes(p, v), stream, p);
}

}  // namespace serval::kernels::cuda
