// RMSNorm kernels, 16-byte vectors. Rows of up to 256 · 8 · kMaxVecs elements stay in registers
// between the sum of squares and the scaling (one pass over memory), and the norm weight is
// requested before the PDL wait (it is constant); longer rows take two passes. A few rows wider
// than 2048 run each row over a cluster of CTAs (rms_norm_cluster_kernel), bit-identical to the
// one-CTA register kernel; more rows, one CTA per row.
#include <cooperative_groups.h>

#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/norm_rope/rms_norm.h"

namespace serval::kernels::cuda {
namespace {

constexpr int kMaxThreads = kRmsNormMaxThreads;
constexpr int kMaxVecs = 4;  // vectors of 8 per thread held in registers (hidden ≤ 8192)

// One 8-element vector of the fused add: v += r (fp32) stored to `residual_at` when it is non-null
// (r then holds the residual's vector); returns Σ v² over the unrounded sums.
__device__ __forceinline__ float add_residual_sum_sq(float (&v)[8], const float (&r)[8],
                                                     __nv_bfloat16* residual_at) {
  if (residual_at != nullptr) {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] += r[j];
    store8(residual_at, v);
  }
  float sum_sq = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) sum_sq += v[j] * v[j];
  return sum_sq;
}

// out_at = v · inv · w; with a residual the stored (bf16-rounded) sums are scaled, as the two-pass
// kernel does (the sum of squares used the unrounded sums, as there).
__device__ __forceinline__ void scale_store(float (&v)[8], bool rounded, float inv,
                                            const float (&w)[8], __nv_bfloat16* out_at) {
  if (rounded)
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = __bfloat162float(__float2bfloat16_rn(v[j]));
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = v[j] * inv * w[j];
  store8(out_at, v);
}

// V vectors per thread: vector i of the thread is threadIdx.x + i·blockDim.x.
template <int V>
__global__ void __launch_bounds__(kMaxThreads)
    rms_norm_reg_kernel(const __nv_bfloat16* x, __nv_bfloat16* residual,
                        const __nv_bfloat16* __restrict__ weight, __nv_bfloat16* out, int hidden,
                        float eps) {
  __shared__ float scratch[V][32];
  const int num_vecs = hidden / 8;
  float w[V][8];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int vec = threadIdx.x + i * blockDim.x;
    if (vec < num_vecs) load8(weight + vec * 8, w[i]);
  }
  pdl_wait();
  pdl_launch_dependents();
  const size_t row = size_t(blockIdx.x) * hidden;
  // Every load before the first store: x and residual may alias as far as the compiler knows, so
  // loads placed after a residual store would wait for it (one L2 round trip per vector).
  float v[V][8], r[V][8];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int vec = threadIdx.x + i * blockDim.x;
    if (vec >= num_vecs) continue;
    load8(x + row + vec * 8, v[i]);
    if (residual != nullptr) load8(residual + row + vec * 8, r[i]);
  }
  // Sum of squares per vector index i (the part of the row that CTA i of the cluster kernel
  // owns), block sums added in i order.
  float sum_sq[V];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    sum_sq[i] = 0.0f;
    const int vec = threadIdx.x + i * blockDim.x;
    if (vec >= num_vecs) continue;
    sum_sq[i] =
        add_residual_sum_sq(v[i], r[i], residual != nullptr ? residual + row + vec * 8 : nullptr);
  }
  const float inv = rsqrtf(block_sum_parts(sum_sq, scratch) / float(hidden) + eps);
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int vec = threadIdx.x + i * blockDim.x;
    if (vec >= num_vecs) continue;
    scale_store(v[i], residual != nullptr, inv, w[i], out + row + vec * 8);
  }
}

// One row over a cluster of C = ceil(hidden / (8 · 256)) CTAs of 256 threads (C ≤ kMaxVecs):
// thread t of rank c owns vector c · 256 + t, which is thread t's vector c in
// rms_norm_reg_kernel<V ≥ C>; each CTA's block sum goes to every CTA's shared memory, and after
// the cluster barrier each adds them in rank order — the register kernel's order, so the bits
// are the same. Why: one SM moving a whole 8192-wide row (64 KB read, 32 KB written) takes the
// norm 2.92 µs in a chain of norms against 1.76 over a cluster of 4 (1.18 at 2048; H200,
// CudaRmsNormBench.Chain); Llama-70B NVFP4 b1 TPOT 11.85 / 11.98 ms vs 12.19 / 12.06, b8 even
// (bench/RESULTS.md 2026-12-02). At 4096 (a cluster of 2) the chain ties, the cluster's fixed
// cost (~0.6 µs) eating the gain.
__global__ void __launch_bounds__(kMaxThreads)
    rms_norm_cluster_kernel(const __nv_bfloat16* x, __nv_bfloat16* residual,
                            const __nv_bfloat16* __restrict__ weight, __nv_bfloat16* out,
                            int hidden, float eps) {
  namespace cg = cooperative_groups;
  __shared__ float scratch[32];
  __shared__ float part_sums[kMaxVecs];  // [rank]: CTA rank's block sum
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank()), ctas = int(cluster.num_blocks());
  const int vec = rank * blockDim.x + threadIdx.x;
  const bool active = vec < hidden / 8;
  float w[8];
  if (active) load8(weight + vec * 8, w);
  pdl_wait();
  pdl_launch_dependents();
  const size_t at = size_t(blockIdx.x / ctas) * hidden + size_t(vec) * 8;
  float v[8], r[8], sum_sq = 0.0f;
  if (active) {
    load8(x + at, v);  // loads before the store: see rms_norm_reg_kernel
    if (residual != nullptr) load8(residual + at, r);
    sum_sq = add_residual_sum_sq(v, r, residual != nullptr ? residual + at : nullptr);
  }
  const float part = block_sum(sum_sq, scratch);
  if (int(threadIdx.x) < ctas) *cluster.map_shared_rank(&part_sums[rank], threadIdx.x) = part;
  cluster.sync();  // every part delivered; nothing touches another CTA's memory after it
  float total = 0.0f;
  for (int c = 0; c < ctas; ++c) total += part_sums[c];
  const float inv = rsqrtf(total / float(hidden) + eps);
  if (active) scale_store(v, residual != nullptr, inv, w, out + at);
}

// Any hidden: two passes over the row (the second hits L1/L2).
__global__ void rms_norm_kernel(const __nv_bfloat16* x, __nv_bfloat16* residual,
                                const __nv_bfloat16* __restrict__ weight, __nv_bfloat16* out,
                                int hidden, float eps) {
  __shared__ float scratch[32];
  pdl_wait();
  pdl_launch_dependents();
  const size_t row = size_t(blockIdx.x) * hidden;
  const int num_vecs = hidden / 8;
  float sum_sq = 0.0f;
  // Pass 1: sum of squares (and the residual update). Each thread owns vectors
  // threadIdx.x + k·blockDim.x in both passes, so x/out aliasing is safe.
  for (int i = threadIdx.x; i < num_vecs; i += blockDim.x) {
    float v[8];
    load8(x + row + i * 8, v);
    if (residual != nullptr) {
      float r[8];
      load8(residual + row + i * 8, r);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] += r[j];
      store8(residual + row + i * 8, v);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) sum_sq += v[j] * v[j];
  }
  const float inv = rsqrtf(block_sum(sum_sq, scratch) / float(hidden) + eps);
  const __nv_bfloat16* src = residual != nullptr ? residual : x;
  for (int i = threadIdx.x; i < num_vecs; i += blockDim.x) {
    float v[8], w[8];
    load8(src + row + i * 8, v);
    load8(weight + i * 8, w);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = v[j] * inv * w[j];
    store8(out + row + i * 8, v);
  }
}

}  // namespace

void rms_norm(const RmsNormParams& p, cudaStream_t stream) {
  if (p.hidden % 8 != 0 || !is_aligned16(p.x) || !is_aligned16(p.weight) || !is_aligned16(p.out) ||
      (p.residual != nullptr && !is_aligned16(p.residual))) {
    throw InvalidArgument("cuda rms_norm: hidden (" + std::to_string(p.hidden) +
                          ") must be a multiple of 8 and pointers 16-byte aligned");
  }
  if (p.rows == 0) return;
  const RmsNormCta cta = rms_norm_cta(p.hidden);
  const int threads = cta.threads, vecs_per_thread = cta.vecs;
  // A cluster per row while the grid stays within one CTA per SM (decode steps); bit-identical.
  if (vecs_per_thread > 1 && vecs_per_thread <= kMaxVecs &&
      int64_t(p.rows) * vecs_per_thread <= sm_count()) {
    launch_pdl_cluster(
        "rms_norm_cluster", rms_norm_cluster_kernel, dim3(unsigned(p.rows * vecs_per_thread)),
        dim3(unsigned(threads)), unsigned(vecs_per_thread), 0, stream,
        reinterpret_cast<const __nv_bfloat16*>(p.x), reinterpret_cast<__nv_bfloat16*>(p.residual),
        reinterpret_cast<const __nv_bfloat16*>(p.weight), reinterpret_cast<__nv_bfloat16*>(p.out),
        p.hidden, p.eps);
    return;
  }
  auto kernel = vecs_per_thread == 1   ? rms_norm_reg_kernel<1>
                : vecs_per_thread == 2 ? rms_norm_reg_kernel<2>
                : vecs_per_thread <= 4 ? rms_norm_reg_kernel<kMaxVecs>
                                       : rms_norm_kernel;
  launch_pdl("rms_norm", kernel, dim3(unsigned(p.rows)), dim3(unsigned(threads)), 0, stream,
             reinterpret_cast<const __nv_bfloat16*>(p.x),
             reinterpret_cast<__nv_bfloat16*>(p.residual),
             reinterpret_cast<const __nv_bfloat16*>(p.weight),
             reinterpret_cast<__nv_bfloat16*>(p.out), p.hidden, p.eps);
}

}  // namespace serval::kernels::cuda
