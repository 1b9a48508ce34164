#include "backend/cuda/pinned_upload.h"

#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "base/thread_pool.h"

namespace serval::backend::cuda {

PinnedUploader::PinnedUploader(size_t chunk_bytes) : chunk_bytes_(chunk_bytes) {}

PinnedUploader::~PinnedUploader() {
  for (int i = 0; i < 2; ++i) {
    if (done_[i]) cudaEventDestroy(done_[i]);
    if (staging_[i]) cudaFreeHost(staging_[i]);
  }
}

void PinnedUploader::copy(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (staging_[0] == nullptr) {
    for (int i = 0; i < 2; ++i) {
      cuda_check(cudaMallocHost(&staging_[i], chunk_bytes_), "cudaMallocHost (upload staging)");
      cuda_check(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming), "cudaEventCreate");
    }
  }
  const auto* from = static_cast<const char*>(src);
  auto* to = static_cast<char*>(dst);
  for (size_t offset = 0, chunk = 0; offset < bytes; offset += chunk_bytes_, ++chunk) {
    const int b = int(chunk % 2);
    const size_t n = std::min(chunk_bytes_, bytes - offset);
    // The copy that last read this buffer (two chunks ago) must be done before it is refilled.
    cuda_check(cudaEventSynchronize(done_[b]), "upload staging wait");
    char* stage = static_cast<char*>(staging_[b]);
    constexpr int64_t kSlice = int64_t{1} << 20;
    ThreadPool::global().parallel_for(int64_t((n + kSlice - 1) / kSlice), 1,
                                      [&](int64_t begin, int64_t end) {
                                        const size_t lo = size_t(begin * kSlice);
                                        const size_t hi = std::min(n, size_t(end * kSlice));
                                        std::memcpy(stage + lo, from + offset + lo, hi - lo);
                                      });
    cuda_check(cudaMemcpyAsync(to + offset, stage, n, cudaMemcpyHostToDevice, stream),
               "upload (pinned)");
    cuda_check(cudaEventRecord(done_[b], stream), "cudaEventRecord");
  }
  cuda_check(cudaStreamSynchronize(stream), "upload sync");
}

}  // namespace serval::backend::cuda
