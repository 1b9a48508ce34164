// RMSNorm kernels: one CTA per row, 16-byte vectors. Rows of up to 256 · 8 · kMaxVecs elements
// stay in registers between the sum of squares and the scaling (one pass over memory), and the
// norm weight is requested before the PDL wait (it is constant); longer rows take two passes.
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/norm_rope/rms_norm.h"

namespace serval::kernels::cuda {
namespace {

constexpr int kMaxThreads = kRmsNormMaxThreads;
constexpr int kMaxVecs = 4;  // vectors of 8 per thread held in registers (hidden ≤ 8192)

// V vectors per thread: vector i of the thread is threadIdx.x + i·blockDim.x.
template <int V>
__global__ void __launch_bounds__(kMaxThreads)
    rms_norm_reg_kernel(const __nv_bfloat16* x, __nv_bfloat16* residual,
                        const __nv_bfloat16* __restrict__ weight, __nv_bfloat16* out, int hidden,
                        float eps) {
  __shared__ float scratch[32];
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
  float sum_sq = 0.0f;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int vec = threadIdx.x + i * blockDim.x;
    if (vec >= num_vecs) continue;
    if (residual != nullptr) {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[i][j] += r[i][j];
      store8(residual + row + vec * 8, v[i]);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) sum_sq += v[i][j] * v[i][j];
  }
  const float inv = rsqrtf(block_sum(sum_sq, scratch) / float(hidden) + eps);
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int vec = threadIdx.x + i * blockDim.x;
    if (vec >= num_vecs) continue;
    // Scale the stored (bf16-rounded) residual, as the two-pass kernel does; the sum of squares
    // above used the unrounded sums, as there.
    if (residual != nullptr)
#pragma unroll
      for (int j = 0; j < 8; ++j) v[i][j] = __bfloat162float(__float2bfloat16_rn(v[i][j]));
#pragma unroll
    for (int j = 0; j < 8; ++j) v[i][j] = v[i][j] * inv * w[i][j];
    store8(out + row + vec * 8, v[i]);
  }
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
