// Fused all-reduce + residual add + RMSNorm (p2p_all_reduce_norm.h). Phases of CTA b:
//   1. weight vectors into registers; pdl_wait; call = ++calls[b], staging half = call % 2;
//   2. for each of its rows t (b, b + 32, …): this rank's delta row to slot [rank][t] of the
//      staging half of every rank (peers through NVLink, its own locally);
//   3. flag exchange with CTA b of every peer (p2p_sync.cuh);
//   4. for each of its rows: the slots [0..N)[t] of its own staging summed in rank order (fp32,
//      L2 loads), rounded to bf16, plus the residual row (fp32): the residual stored rounded, the
//      sum of squares of the unrounded sums, then out = bf16(residual) · inv_rms · weight, the
//      arithmetic of rms_norm_reg_kernel (the sum of squares is added in another order).
// The slots of row t from rank r are written only by rank r's CTA b and read only by each rank's
// CTA b, and the protocol of p2p_sync.cuh keeps a half from being rewritten while it is read.
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
  pdl_wait();
  pdl_launch_dependents();
  const uint32_t call = p2p::begin_call(p.block, p.max_bytes, s_base, &s_call);
  const size_t half = size_t(call & 1u) * p.max_bytes;
  // Slot [r][t] of a staging half: row t of rank r, hidden bf16 values.
  auto slot = [&](uint8_t* base, int r, int t) {
    return reinterpret_cast<uint4*>(base + half + (size_t(r) * p.rows + t) * size_t(H) * 2);
  };

  for (int t = blockIdx.x; t < p.rows; t += kP2pBlocks) {
    const uint4* src = reinterpret_cast<const uint4*>(p.delta + size_t(t) * H);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const int vec = tid + i * kThreads;
      if (vec >= vecs) continue;
      const uint4 q = src[vec];
      for (int r = 0; r < p.ranks; ++r) slot(s_base[r], p.rank, t)[vec] = q;
    }
  }
  p2p::exchange_flags(s_base, p.block, p.max_bytes, p.rank, p.ranks, call, p.aborted);

  for (int t = blockIdx.x; t < p.rows; t += kP2pBlocks) {
    __nv_bfloat16* res = reinterpret_cast<__nv_bfloat16*>(p.residual) + size_t(t) * H;
    float v[V][8];
    float sum_sq = 0.0f;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const int vec = tid + i * kThreads;
      if (vec >= vecs) continue;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int r = 0; r < p.ranks; ++r)
        p2p::add_vector<true>(acc, __ldcg(slot(p.block, r, t) + vec));
      float rv[8];
      load8(res + size_t(vec) * 8, rv);
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
         size_t(p.ranks) * size_t(p.rows) * size_t(p.hidden) * 2 <= p.max_bytes &&
         p.max_bytes % 16 == 0 && is_aligned16(p.delta) && is_aligned16(p.residual) &&
         is_aligned16(p.weight) && is_aligned16(p.out) && p.block != nullptr &&
         p.aborted != nullptr;
}

void p2p_all_reduce_norm(const P2pAllReduceNormParams& p, cudaStream_t stream) {
  if (!p2p_all_reduce_norm_supported(p))
    throw InvalidArgument("p2p_all_reduce_norm: need hidden % 8 == 0 and <= " +
                          std::to_string(kThreads * 8 * kMaxVecs) +
                          ", ranks · rows · hidden · 2 <= " + std::to_string(p.max_bytes) +
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
