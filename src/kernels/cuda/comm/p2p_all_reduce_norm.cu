// Fused all-reduce + residual add + RMSNorm (p2p_all_reduce_norm.h), on the low-latency (LL)
// staging of the blocks: every 4-byte payload travels in an 8-byte word with the call number in
// its high half (aligned 8-byte stores and loads are single-copy atomic, so a word showing the
// current call carries the current payload). No flags, no barriers between the ranks: CTA b of
// every rank owns rows b, b + 32, …; for each, every thread
//   1. before pdl_wait: loads its norm weights and (thread 0) advances call = ++calls[b] (LL
//      half = call % 2; p2p_sync.cuh says when that may precede the wait); after it: stores the
//      words of its vectors of this rank's delta row into slot [rank][t] of every peer's LL half
//      (NVLink, fire and forget);
//   2. polls its own LL half until the peers' words of those vectors show `call`, then adds the
//      ranks' values in rank order 0..N-1 (its own from delta: the same bits it sent) in fp32,
//      rounds once to bf16, adds the residual: the residual stored rounded, the sum of squares of
//      the unrounded sums; out = bf16(residual) · inv_rms · weight, the arithmetic of
//      rms_norm_reg_kernel (the sum of squares is added in another order).
// A slot of half h is rewritten at call c + 2 by a rank that has completed call c + 1, for which
// it read every peer's words of call c + 1, stored after their pdl_wait: so every peer's call c
// (and its reads of half h) had completed.
#include "kernels/cuda/comm/p2p_all_reduce_norm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "base/error.h"
#include "kernels/cuda/comm/p2p_all_reduce.h"
#include "kernels/cuda/comm/p2p_sync.cuh"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"

namespace serval::kernels::cuda {

namespace {

constexpr int kThreads = 512;
constexpr int kMaxVecs = 4;  // 16-byte vectors per thread and row: hidden ≤ 512 · 8 · 4

__device__ __forceinline__ void st_ll(uint64_t* p, uint64_t a, uint64_t b) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}

__device__ __forceinline__ void ld_ll(const uint64_t* p, uint64_t& a, uint64_t& b) {
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
}

// The four LL words of one 16-byte vector (8 bf16) for `call`.
__device__ __forceinline__ void ll_words(uint4 q, uint32_t call, uint64_t (&w)[4]) {
  const uint64_t hi = uint64_t(call) << 32;
  w[0] = hi | q.x;
  w[1] = hi | q.y;
  w[2] = hi | q.z;
  w[3] = hi | q.w;
}

// Waits until the two 16-byte halves at p (4 words) show `call`; returns their payloads. Gives
// up once the group's abort word is set (read once per 1024 polls: host memory).
__device__ __forceinline__ uint4 poll_ll(const uint64_t* p, uint32_t call,
                                         const volatile uint32_t* aborted) {
  uint64_t w[4];
  for (uint32_t spin = 1;; ++spin) {
    ld_ll(p, w[0], w[1]);
    ld_ll(p + 2, w[2], w[3]);
    if (uint32_t(w[0] >> 32) == call && uint32_t(w[1] >> 32) == call &&
        uint32_t(w[2] >> 32) == call && uint32_t(w[3] >> 32) == call)
      break;
    if (spin % 1024 == 0 && *aborted) break;
  }
  return make_uint4(uint32_t(w[0]), uint32_t(w[1]), uint32_t(w[2]), uint32_t(w[3]));
}

// Eight bf16 values (a 16-byte vector, element 0 in the low half of q.x) as floats.
__device__ __forceinline__ void unpack8(uint4 q, float (&v)[8]) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(w[i] << 16);
    v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}

// V vectors per thread and row: vector i of the thread is threadIdx.x + i · kThreads.
template <int V>
__global__ void __launch_bounds__(kThreads) p2p_all_reduce_norm_kernel(P2pAllReduceNormParams p) {
  __shared__ uint32_t s_call;
  __shared__ uint8_t* s_base[kP2pMaxRanks];
  __shared__ float scratch[32];
  const int tid = threadIdx.x, H = p.hidden, vecs = H / 8;
  float w[V][8];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int vec = tid + i * kThreads;
    if (vec < vecs) load8(reinterpret_cast<const __nv_bfloat16*>(p.weight) + size_t(vec) * 8, w[i]);
  }
  // The call counter is advanced before pdl_wait, overlapping its round trip with the previous
  // kernel's tail: only all-reduce kernels touch it, and one that precedes this kernel has
  // advanced it before its own trigger (here, fenced below) or completed (the plain all-reduce,
  // launched without PDL), so this kernel cannot start before that update is visible.
  const uint32_t call = p2p::begin_call(p.block, p.max_bytes, s_base, &s_call);
  if (threadIdx.x == 0) __threadfence();
  __syncthreads();
  pdl_launch_dependents();
  pdl_wait();
  // This CTA's first row (its only one in decode: rows ≤ kP2pBlocks) of delta and the residual,
  // loaded once into registers. Up to V = 2 (hidden ≤ 8192): at V = 4 the registers would spill.
  constexpr bool kPrefetch = V <= 2;
  const uint4* delta = reinterpret_cast<const uint4*>(p.delta);
  const int t0 = kPrefetch ? int(blockIdx.x) : -1;
  uint4 delta0[V], res0[V];
  if (kPrefetch && t0 < p.rows) {
    const uint4* res_row = reinterpret_cast<const uint4*>(p.residual) + size_t(t0) * vecs;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const int vec = tid + i * kThreads;
      if (vec < vecs) {
        delta0[i] = delta[size_t(t0) * vecs + vec];
        res0[i] = res_row[vec];
      }
    }
  }
  // Vector i of row t of delta (prefetched for the first row).
  auto delta_vec = [&](int t, int i, int vec) {
    return t == t0 ? delta0[i] : delta[size_t(t) * vecs + vec];
  };
  const size_t half = size_t(call & 1u) * p.max_bytes;
  // Slot [r][t] of an LL half: row t of rank r, 4 words (32 bytes) per vector.
  auto slot = [&](uint8_t* block, int r, int t) {
    return reinterpret_cast<uint64_t*>(p2p::ll_of(block, p.max_bytes) + half +
                                       (size_t(r) * p.rows + t) * size_t(vecs) * 32);
  };

  for (int t = blockIdx.x; t < p.rows; t += kP2pBlocks) {
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const int vec = tid + i * kThreads;
      if (vec >= vecs) continue;
      uint64_t words[4];
      ll_words(delta_vec(t, i, vec), call, words);
      for (int r = 0; r < p.ranks; ++r) {
        if (r == p.rank) continue;
        uint64_t* dst = slot(s_base[r], p.rank, t) + size_t(vec) * 4;
        st_ll(dst, words[0], words[1]);
        st_ll(dst + 2, words[2], words[3]);
      }
    }
  }

  for (int t = blockIdx.x; t < p.rows; t += kP2pBlocks) {
    __nv_bfloat16* res = reinterpret_cast<__nv_bfloat16*>(p.residual) + size_t(t) * H;
    float v[V][8];
    float sum_sq = 0.0f;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const int vec = tid + i * kThreads;
      if (vec >= vecs) continue;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int r = 0; r < p.ranks; ++r) {
        const uint4 q = r == p.rank
                            ? delta_vec(t, i, vec)
                            : poll_ll(slot(p.block, r, t) + size_t(vec) * 4, call, p.aborted);
        p2p::add_vector<true>(acc, q);
      }
      float rv[8];
      if (t == t0) {
        unpack8(res0[i], rv);
      } else {
        load8(res + size_t(vec) * 8, rv);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        v[i][j] = __bfloat162float(__float2bfloat16_rn(acc[j])) + rv[j];
        sum_sq += v[i][j] * v[i][j];
      }
      store8(res + size_t(vec) * 8, v[i]);
    }
    const float inv = rsqrtf(block_sum(sum_sq, scratch) / float(H) + p.eps);
    __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(p.out) + size_t(t) * H;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const int vec = tid + i * kThreads;
      if (vec >= vecs) continue;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        v[i][j] = __bfloat162float(__float2bfloat16_rn(v[i][j])) * inv * w[i][j];
      store8(out + size_t(vec) * 8, v[i]);
    }
  }
}

}  // namespace

bool p2p_all_reduce_norm_supported(const P2pAllReduceNormParams& p) {
  return p.rows >= 1 && p.hidden > 0 && p.hidden % 8 == 0 && p.hidden <= kThreads * 8 * kMaxVecs &&
         p.ranks >= 2 && p.ranks <= kP2pMaxRanks && p.rank >= 0 && p.rank < p.ranks &&
         size_t(p.ranks) * size_t(p.rows) * size_t(p.hidden) * 4 <= p.max_bytes &&
         p.max_bytes % 16 == 0 && is_aligned16(p.delta) && is_aligned16(p.residual) &&
         is_aligned16(p.weight) && is_aligned16(p.out) && p.block != nullptr &&
         p.aborted != nullptr;
}

void p2p_all_reduce_norm(const P2pAllReduceNormParams& p, cudaStream_t stream) {
  if (!p2p_all_reduce_norm_supported(p))
    throw InvalidArgument("p2p_all_reduce_norm: need hidden % 8 == 0 and <= " +
                          std::to_string(kThreads * 8 * kMaxVecs) +
                          ", ranks · rows · hidden · 4 <= " + std::to_string(p.max_bytes) +
                          " staging bytes, 16-byte aligned rows, 2.." +
                          std::to_string(kP2pMaxRanks) + " ranks; got rows " +
                          std::to_string(p.rows) + ", hidden " + std::to_string(p.hidden) +
                          ", rank " + std::to_string(p.rank) + " of " + std::to_string(p.ranks));
  const int v = (p.hidden / 8 + kThreads - 1) / kThreads;
  auto kernel = v == 1   ? p2p_all_reduce_norm_kernel<1>
                : v == 2 ? p2p_all_reduce_norm_kernel<2>
                         : p2p_all_reduce_norm_kernel<kMaxVecs>;
  launch_pdl("p2p_all_reduce_norm", kernel, dim3(kP2pBlocks), dim3(kThreads), 0, stream, p);
}

}  // namespace serval::kernels::cuda
