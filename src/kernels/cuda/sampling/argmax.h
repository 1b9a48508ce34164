// Row-wise argmax of fp32 logits (greedy sampling on the device).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace serval::kernels::cuda {

// out[r] = argmax_v logits[r, v]; ties go to the lowest index; NaN is never chosen over a number.
struct ArgmaxParams {
  const float* logits;  // [rows, vocab]
  int32_t* out;         // [rows]
  int rows, vocab;
};

void argmax(const ArgmaxParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
