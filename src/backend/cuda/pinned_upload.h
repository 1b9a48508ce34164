// Host → device copies of large weights through two pinned staging buffers: while the GPU copies
// one chunk, the host threads fill the other (reading a memory-mapped checkpoint page-faults
// there, in parallel), so disk or page-cache reads overlap the transfers and the DMA runs from
// pinned memory at full PCIe speed instead of the driver's pageable path.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

namespace serval::backend::cuda {

class PinnedUploader {
 public:
  explicit PinnedUploader(size_t chunk_bytes = size_t{64} << 20);
  ~PinnedUploader();
  PinnedUploader(const PinnedUploader&) = delete;
  PinnedUploader& operator=(const PinnedUploader&) = delete;

  // dst (device) ← src (host), `bytes` bytes, on `stream`; returns when the copy is complete
  // (src may be unmapped or freed afterwards). The buffers are allocated on first use.
  void copy(void* dst, const void* src, size_t bytes, cudaStream_t stream);

 private:
  size_t chunk_bytes_;
  void* staging_[2] = {nullptr, nullptr};
  cudaEvent_t done_[2] = {nullptr, nullptr};
};

}  // namespace serval::backend::cuda
