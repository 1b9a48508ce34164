// cp.async (sm_80+): 16-byte global → shared copies that bypass L1 (and 8-byte ones through it),
// in commit groups.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace serval::kernels::cuda {

// 16 bytes global → shared at shared-memory address `smem`; valid == false zero-fills and reads
// nothing.
__device__ __forceinline__ void cp_async_16(uint32_t smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  cp_async_16(uint32_t(__cvta_generic_to_shared(smem)), gmem, valid);
}

// 8 bytes global → shared (the .ca form: .cg copies only 16 bytes); both addresses 8-byte
// aligned. Same commit groups as cp_async_16.
__device__ __forceinline__ void cp_async_8(void* smem, const void* gmem) {
  asm volatile(
      "cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(uint32_t(__cvta_generic_to_shared(smem))),
      "l"(gmem)
      : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most kPending of this thread's committed groups are in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace serval::kernels::cuda
