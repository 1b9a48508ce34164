// The MoE finalize (moe_gemm.h): out[t, :] = Σ_j w[t, j] · Y[e2p[t·k + j], :] in fp32, j = 0 …
// top_k − 1 in order, skipping −1 rows; optionally followed, in the same kernel, by the residual
// add + RMSNorm of the next block.
//
// Plain: grid (tokens, column slices); each thread owns one 16-byte chunk (8 columns) of one
// token, so a decode token is spread over hidden / (8 · kFinalizeThreads) CTAs.
// With the norm: one CTA per token in rms_norm's shape (rms_norm_cta: thread i owns the chunks
// i + v·threads, v < V), so that the sum of squares is reduced exactly as rms_norm reduces it
// (block sums per v, added in v order: block_sum_parts).
// Both take the choices kFinalizeGroup at a time: all their row indices and weights are loaded
// first, then all their Y chunks, so a group costs two dependent memory round trips instead of
// one per choice; the accumulation stays in choice order (same fp32 sums as one load at a time,
// and the same in both kernels).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "base/error.h"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/moe/moe_gemm.h"
#include "kernels/cuda/norm_rope/rms_norm.h"

namespace serval::kernels::cuda {

namespace {

constexpr int kFinalizeThreads = 64;
constexpr int kFinalizeGroup = 8;
constexpr int kNormMaxVecs = kMoeFinalizeNormMaxHidden / (8 * kRmsNormMaxThreads);
static_assert(kNormMaxVecs == 4, "rms_norm's register kernel holds up to 4 vectors per thread");

// Choices [j0, j0 + kFinalizeGroup) of a token: permuted rows (−1 past top_k or dropped) and
// routing weights.
struct ChoiceGroup {
  int row[kFinalizeGroup];
  float w[kFinalizeGroup];
};

__device__ __forceinline__ ChoiceGroup load_choices(const MoeFinalizeParams& p, int t, int j0) {
  ChoiceGroup g;
  const int32_t* e2p = p.expanded_to_permuted + size_t(t) * p.top_k;
  const float* weights = p.topk_weights + size_t(t) * p.top_k;
#pragma unroll
  for (int u = 0; u < kFinalizeGroup; ++u) {
    const bool in = j0 + u < p.top_k;
    g.row[u] = in ? e2p[j0 + u] : -1;
    g.w[u] = in ? weights[j0 + u] : 0.0f;
  }
  return g;
}

// acc += Σ_u g.w[u] · Y[g.row[u], 8c .. 8c + 8) in u order (all the group's loads first).
__device__ __forceinline__ void accumulate(const MoeFinalizeParams& p, const ChoiceGroup& g, int c,
                                           float (&acc)[8]) {
  const __nv_bfloat16* Y = reinterpret_cast<const __nv_bfloat16*>(p.y);
  uint4 v[kFinalizeGroup];
#pragma unroll
  for (int u = 0; u < kFinalizeGroup; ++u)
    v[u] = g.row[u] >= 0 ? *reinterpret_cast<const uint4*>(Y + size_t(g.row[u]) * p.hidden + c * 8)
                         : make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int u = 0; u < kFinalizeGroup; ++u) {
    if (g.row[u] < 0) continue;
    const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&v[u]);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(h2[i]);
      acc[2 * i] += g.w[u] * f.x;
      acc[2 * i + 1] += g.w[u] * f.y;
    }
  }
}

__global__ void __launch_bounds__(kFinalizeThreads) finalize_kernel(MoeFinalizeParams p) {
  pdl_wait();  // y comes from GEMM2, the maps from routing
  const int t = blockIdx.x;
  const int chunks = p.hidden / 8;
  for (int c = blockIdx.y * kFinalizeThreads + threadIdx.x; c < chunks;
       c += gridDim.y * kFinalizeThreads) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j0 = 0; j0 < p.top_k; j0 += kFinalizeGroup)
      accumulate(p, load_choices(p, t, j0), c, acc);
    store8(reinterpret_cast<__nv_bfloat16*>(p.out) + size_t(t) * p.hidden + c * 8, acc);
  }
}

// V chunks per thread (V ≤ kNormMaxVecs). The arithmetic after the sums is rms_norm_reg_kernel's
// with x = the bf16-rounded sums (rms_norm.cu): s = x + residual in fp32, the residual stored as
// bf16(s), the sum of squares over the unrounded s, then bf16(s) · inv_rms · weight.
template <int V>
__global__ void __launch_bounds__(kRmsNormMaxThreads) finalize_norm_kernel(MoeFinalizeParams p) {
  __shared__ float scratch[V][32];
  const int t = blockIdx.x, num_vecs = p.hidden / 8;
  const __nv_bfloat16* norm_weight = reinterpret_cast<const __nv_bfloat16*>(p.next.weight);
  __nv_bfloat16* residual = reinterpret_cast<__nv_bfloat16*>(p.next.residual);
  __nv_bfloat16* norm_out = reinterpret_cast<__nv_bfloat16*>(p.next.out);
  float nw[V][8];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int vec = threadIdx.x + i * blockDim.x;
    if (vec < num_vecs) load8(norm_weight + vec * 8, nw[i]);
  }
  pdl_wait();  // y from GEMM2, the maps from routing, the residual from the step's earlier kernels
  pdl_launch_dependents();
  const size_t row = size_t(t) * p.hidden;
  float v[V][8], r[V][8];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int vec = threadIdx.x + i * blockDim.x;
    if (vec >= num_vecs) continue;
    load8(residual + row + vec * 8, r[i]);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[i][j] = 0.0f;
  }
  for (int j0 = 0; j0 < p.top_k; j0 += kFinalizeGroup) {
    const ChoiceGroup g = load_choices(p, t, j0);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const int vec = threadIdx.x + i * blockDim.x;
      if (vec < num_vecs) accumulate(p, g, vec, v[i]);
    }
  }
  float sum_sq[V];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    sum_sq[i] = 0.0f;
    const int vec = threadIdx.x + i * blockDim.x;
    if (vec >= num_vecs) continue;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      v[i][j] = __bfloat162float(__float2bfloat16_rn(v[i][j])) + r[i][j];  // out, then the add
    }
    store8(residual + row + vec * 8, v[i]);
#pragma unroll
    for (int j = 0; j < 8; ++j) sum_sq[i] += v[i][j] * v[i][j];
  }
  const float inv = rsqrtf(block_sum_parts(sum_sq, scratch) / float(p.hidden) + p.next.eps);
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int vec = threadIdx.x + i * blockDim.x;
    if (vec >= num_vecs) continue;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      v[i][j] = __bfloat162float(__float2bfloat16_rn(v[i][j])) * inv * nw[i][j];
    store8(norm_out + row + vec * 8, v[i]);
  }
}

}  // namespace

void moe_finalize(const MoeFinalizeParams& p, cudaStream_t stream) {
  if (p.hidden % 8 != 0) throw InvalidArgument("moe_finalize: hidden % 8 != 0");
  if (p.next.residual != nullptr &&
      (p.hidden > kMoeFinalizeNormMaxHidden || !is_aligned16(p.next.residual) ||
       !is_aligned16(p.next.weight) || !is_aligned16(p.next.out)))
    throw InvalidArgument("moe_finalize: the fused norm needs hidden <= " +
                          std::to_string(kMoeFinalizeNormMaxHidden) +
                          " and 16-byte aligned residual, norm weight and output (hidden " +
                          std::to_string(p.hidden) + ")");
  if (p.num_tokens <= 0 || p.hidden <= 0) return;
  if (p.next.residual != nullptr) {
    const RmsNormCta cta = rms_norm_cta(p.hidden);
    auto kernel = cta.vecs == 1   ? finalize_norm_kernel<1>
                  : cta.vecs == 2 ? finalize_norm_kernel<2>
                                  : finalize_norm_kernel<kNormMaxVecs>;
    launch_pdl("moe_finalize_norm", kernel, dim3(unsigned(p.num_tokens)),
               dim3(unsigned(cta.threads)), 0, stream, p);
    return;
  }
  const int chunks = p.hidden / 8;
  const int slices = (chunks + kFinalizeThreads - 1) / kFinalizeThreads;
  launch_pdl("moe_finalize", finalize_kernel, dim3(unsigned(p.num_tokens), unsigned(slices)),
             dim3(kFinalizeThreads), 0, stream, p);
}

}  // namespace serval::kernels::cuda
