// Stubs for builds without CUDA (backend/cuda/nccl_communicator.cpp defines the real ones) and
// the process set-up shared by both builds.
#include "backend/communicator.h"

#include <cstdlib>

#include "base/error.h"

namespace serval::backend {

void prefer_eager_cuda_module_loading() {
  setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
}

#ifndef SERVAL_HAVE_CUDA
std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(std::span<Backend* const>, int) {
  throw InvalidArgument(
      "NCCL communicators: serval was built without CUDA (tensor parallel on GPUs needs a CUDA "
      "build; --device cpu runs tensor parallel in threads)");
}

NcclUniqueId make_nccl_unique_id() {
  throw InvalidArgument("multi-node serving needs NCCL: serval was built without CUDA");
}

std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(std::span<Backend* const>, int,
                                                                   const NcclUniqueId&, int, int) {
  throw InvalidArgument("multi-node serving needs NCCL: serval was built without CUDA");
}

void bind_cuda_device(int) {}
#endif

}  // namespace serval::backend
