// RMSNorm kernel: one CTA per row, 16-byte vectors, two passes over the row (the second hits
// L1/L2).
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/norm_rope/rms_norm.h"

namespace serval::kernels::cuda {
namespace {

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
  // One vector per thread up to 256 threads; more vectors loop.
  int threads = ((p.hidden / 8 + 31) / 32) * 32;
  threads = threads < 32 ? 32 : (threads > 256 ? 256 : threads);
  launch_pdl("rms_norm", rms_norm_kernel, dim3(unsigned(p.rows)), dim3(unsigned(threads)), 0,
             stream, reinterpret_cast<const __nv_bfloat16*>(p.x),
             reinterpret_cast<__nv_bfloat16*>(p.residual),
             reinterpret_cast<const __nv_bfloat16*>(p.weight),
             reinterpret_cast<__nv_bfloat16*>(p.out), p.hidden, p.eps);
}

}  // namespace serval::kernels::cuda
