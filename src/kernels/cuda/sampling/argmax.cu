#include <cfloat>

#include "base/error.h"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/sampling/argmax.h"

namespace serval::kernels::cuda {

namespace {

constexpr int kThreads = 1024;

struct Best {
  float value;
  int index;
};

__device__ Best better(Best a, Best b) {
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

// One CTA per row: strided scan, then a warp-shuffle and shared-memory reduction.
__global__ void argmax_kernel(ArgmaxParams p) {
  pdl_wait();
  pdl_launch_dependents();
  const float* row = p.logits + size_t(blockIdx.x) * p.vocab;
  Best best{-FLT_MAX, p.vocab};
  for (int v = threadIdx.x; v < p.vocab; v += kThreads) {
    float x = row[v];
    if (x == x) best = better(best, Best{x, v});  // skip NaN
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    Best other{__shfl_xor_sync(0xffffffffu, best.value, offset),
               __shfl_xor_sync(0xffffffffu, best.index, offset)};
    best = better(best, other);
  }
  __shared__ Best warp_best[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    Best b = warp_best[0];
    for (int w = 1; w < kThreads / 32; ++w) b = better(b, warp_best[w]);
    p.out[blockIdx.x] = b.index < p.vocab ? b.index : 0;
  }
}

}  // namespace

void argmax(const ArgmaxParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  launch_pdl("argmax", argmax_kernel, dim3(unsigned(p.rows)), dim3(kThreads), 0, stream, p);
}

}  // namespace serval::kernels::cuda
