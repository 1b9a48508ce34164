// The CUDA backend's side of MLA attention (Backend::mla_attention): shapes checked, the step's
// temporaries taken from the backend, then the two kernels of
// kernels/cuda/attention/mla_attention.h.
#pragma once
#include <cuda_runtime_api.h>

#include "backend/backend.h"

namespace serval::backend::cuda {

// Backend::mla_attention on `b`'s bf16 tensors: mla_prepare (cache rows, the rotated q rope parts
// into a bf16 step temporary [T, H, R]) then mla_attention (its split-KV workspace from the step
// arena when the grid is small), enqueued on `stream`.
void run_mla_attention(Backend& b, const Tensor& q, const Tensor& q_lat, const Tensor& kv,
                       const MlaParams& a, KvCacheLayer& cache, const StepMetadata& meta,
                       Tensor& out, cudaStream_t stream);

}  // namespace serval::backend::cuda
