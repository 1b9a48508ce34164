#include "kernels/cuda/misc/smem_opt_in.h"

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <string>

#include "base/error.h"
#include "base/first_use_fence.h"

namespace serval::kernels::cuda {

namespace {

constexpr int kMaxDevices = 64;

// The largest size granted so far per kernel, one table per device, each with its own lock: the
// ranks of a tensor-parallel group (one GPU each) never wait for one another here. (A
// process-wide lock held across cudaFuncSetAttribute could let a rank whose GPU spins in an
// all-reduce keep its peer from launching the matching one; it was suspected of, and cleared of,
// the TP=2 start-up hang of bench/RESULTS.md, 2026-11-30.)
struct DeviceGrants {
  std::mutex mutex;
  std::map<const void*, size_t> granted;
};

DeviceGrants& grants(int device) {
  static DeviceGrants per_device[kMaxDevices];
  return per_device[device];
}

}  // namespace

void allow_dynamic_smem(const void* kernel, size_t bytes, const char* who) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error(std::string(who) + ": no current CUDA device");
  }
  if (device < 0 || device >= kMaxDevices)
    throw Error(std::string(who) + ": CUDA device " + std::to_string(device) + " beyond the " +
                std::to_string(kMaxDevices) + " supported");
  DeviceGrants& g = grants(device);
  std::lock_guard<std::mutex> lock(g.mutex);
  size_t& have = g.granted[kernel];
  if (have >= bytes) return;
  // A kernel's first attribute set may wait in the driver for the GPUs to drain: inside the
  // thread's first-use fence (tensor-parallel ranks; base/first_use_fence.h).
  FirstUseFence* fence = thread_first_use_fence();
  if (fence) fence->before();
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (fence) fence->after();
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error(std::string(who) + ": cannot allow " + std::to_string(bytes) +
                " bytes of dynamic shared memory: " + cudaGetErrorString(e));
  }
  have = bytes;
}

}  // namespace serval::kernels::cuda
