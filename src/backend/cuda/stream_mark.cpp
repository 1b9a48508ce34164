#include "backend/cuda/stream_mark.h"

#include "backend/cuda/cuda_check.h"

namespace serval::backend::cuda {

CudaStreamMark::CudaStreamMark(cudaStream_t stream, OpProfiler& profiler)
    : stream_(stream), profiler_(profiler) {
  cuda_check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
}

CudaStreamMark::~CudaStreamMark() {
  cudaEventDestroy(event_);
}

void CudaStreamMark::record() {
  cuda_check(cudaEventRecord(event_, stream_), "cudaEventRecord");
}

void CudaStreamMark::wait() {
  ActivityScope activity(profiler_, "waiting for the GPU (stream mark)");
  cuda_check(cudaEventSynchronize(event_), "cudaEventSynchronize");
}

}  // namespace serval::backend::cuda
