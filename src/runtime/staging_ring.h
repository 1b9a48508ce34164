// Host memory for a step's copies to the device in two buffers used in turn (pinned on CUDA), so
// that the next step can be filled while this step's copy is still queued behind the device's
// work (async scheduling).
#pragma once
#include <cstddef>
#include <memory>

#include "backend/backend.h"

namespace serval::runtime {

class StagingRing {
 public:
  explicit StagingRing(backend::Backend& b);
  // The next buffer, at least `bytes` long, once its previous copy has run. Queue the copy from
  // it, then call copy_queued() before the next call.
  void* next(size_t bytes);
  void copy_queued();

 private:
  backend::Backend& b_;
  struct Buffer {
    std::shared_ptr<void> host;
    size_t bytes = 0;
    std::unique_ptr<backend::StreamMark> copied;  // passes once the buffer's last copy has run
  };
  Buffer buffers_[2];
  int next_ = 0;
};

}  // namespace serval::runtime
