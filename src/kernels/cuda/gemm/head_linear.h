// One small bf16 linear per head (MLA's absorbed projections), in CUDA cores with fp32
// accumulation.
#pragma once
#include <cuda_runtime_api.h>

#include "base/dtype.h"

namespace serval::kernels::cuda {

// Tokens up to which head_linear streams the weights once with all tokens' inputs in shared memory
// (decode: bandwidth-bound on w); above, a 64 × 64 tiled product per head.
constexpr int kHeadLinearGemvMaxTokens = 8;

// y[t, h·n + i] = Σ_{j<k} w[h, i, j] · x[t, h·x_stride + j], rounded once to bf16.
// The streaming path needs k % 8 == 0, w 16-byte aligned and k · (num_tokens rounded up to 1, 2, 4
// or 8) ≤ 12288; other shapes take the tiled path, which accepts any sizes and alignments.
struct HeadLinearParams {
  const bf16* x;  // [num_tokens, num_heads · x_stride], x_stride ≥ k
  const bf16* w;  // [num_heads, n, k]
  bf16* y;        // [num_tokens, num_heads · n]
  int num_tokens, num_heads, n, k, x_stride;
};

// Launched with programmatic dependent launch: the streaming path requests its first weights
// before waiting for the previous kernel (w must not be written by it).
void head_linear(const HeadLinearParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
