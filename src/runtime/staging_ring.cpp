#include "runtime/staging_ring.h"

#include <algorithm>

namespace serval::runtime {

StagingRing::StagingRing(backend::Backend& b) : b_(b) {
  for (Buffer& buffer : buffers_) buffer.copied = b_.make_mark();
}

void* StagingRing::next(size_t bytes) {
  Buffer& buffer = buffers_[next_];
  buffer.copied->wait();
  if (buffer.bytes < bytes) {
    buffer.bytes = std::max(bytes, size_t{4096});
    buffer.host = b_.host_staging(buffer.bytes);
  }
  return buffer.host.get();
}

void StagingRing::copy_queued() {
  buffers_[next_].copied->record();
  next_ ^= 1;
}

}  // namespace serval::runtime
