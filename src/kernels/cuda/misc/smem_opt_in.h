// The opt-in that lets a kernel use more than 48 KB of dynamic shared memory.
//
// cudaFuncSetAttribute(..., MaxDynamicSharedMemorySize, ...) applies to the current device only:
// under tensor parallel one process drives several GPUs, so a once-per-process opt-in leaves the
// other GPUs' launches failing with "invalid argument". This does it once per (kernel, device).
#pragma once
#include <cstddef>

namespace serval::kernels::cuda {

// Allows `kernel` (a __global__ function's address) `bytes` of dynamic shared memory on the
// current device. Cheap after the first call per (kernel, device); not a stream operation, so
// safe during graph capture. Throws serval::Error naming `who` if the driver refuses.
void allow_dynamic_smem(const void* kernel, size_t bytes, const char* who);

template <typename... Args>
void allow_dynamic_smem(void (*kernel)(Args...), size_t bytes, const char* who) {
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes, who);
}

}  // namespace serval::kernels::cuda
