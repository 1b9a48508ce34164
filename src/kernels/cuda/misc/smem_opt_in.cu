#include "kernels/cuda/misc/smem_opt_in.h"

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "base/error.h"

namespace serval::kernels::cuda {

void allow_dynamic_smem(const void* kernel, size_t bytes, const char* who) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error(std::string(who) + ": no current CUDA device");
  }
  // The largest size granted so far per (kernel, device).
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, size_t> granted;
  std::lock_guard<std::mutex> lock(mutex);
  size_t& have = granted[{kernel, device}];
  if (have >= bytes) return;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error(std::string(who) + ": cannot allow " + std::to_string(bytes) +
                " bytes of dynamic shared memory: " + cudaGetErrorString(e));
  }
  have = bytes;
}

}  // namespace serval::kernels::cuda
