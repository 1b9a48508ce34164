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

// Up to 1024 rows, each row is split over up to 128 CTAs (one per 4096 logits) that combine
// through per-row slots in device memory: launches of argmax must not run concurrently on one
// device (stream-ordered launches are fine). More rows: one CTA per row.
void argmax(const ArgmaxParams& p, cudaStream_t stream);

// The previous kernel, one CTA of 1024 threads per row (same results): kept for the side-by-side
// benchmark and as a second device implementation in the tests.
void argmax_single_cta(const ArgmaxParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
