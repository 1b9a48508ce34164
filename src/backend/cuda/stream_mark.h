// A CUDA event on the backend's stream (Backend::make_mark): the host waits for one point of
// the queued work instead of the whole stream.
#pragma once
#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/op_profiler.h"

namespace serval::backend::cuda {

class CudaStreamMark final : public StreamMark {
 public:
  // An event without timing; `profiler` (the backend's) shows the wait as its activity.
  CudaStreamMark(cudaStream_t stream, OpProfiler& profiler);
  ~CudaStreamMark() override;
  CudaStreamMark(const CudaStreamMark&) = delete;
  CudaStreamMark& operator=(const CudaStreamMark&) = delete;
  void record() override;
  // Returns at once when never recorded.
  void wait() override;

 private:
  cudaStream_t stream_;
  OpProfiler& profiler_;
  cudaEvent_t event_ = nullptr;
};

}  // namespace serval::backend::cuda
