// cp.async (sm_80+): 16-byte global → shared copies that bypass L1, in commit groups.
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

// An L2 cache policy (createpolicy, sm_80+) for copies of data read once per step, e.g. decode
// weights: evict_first, so that they do not push out what is reused (code, activations, the KV
// cache).
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// cp_async_16 (always valid) with an L2 cache policy from createpolicy. The shared address is
// converted inside the asm: with a 32-bit shared address ptxas emitted the uniform-register form
// of LDGSTS ([R+UR+imm]) for some of the hinted copies, and those trapped with "illegal
// instruction" on the H200 (CUDA 13.0; bench/RESULTS.md 2026-12-02).
__device__ __forceinline__ void cp_async_16_policy(void* smem, const void* gmem, uint64_t policy) {
  asm volatile(
      "{\n .reg .u64 sdst;\n cvta.to.shared.u64 sdst, %0;\n"
      " cp.async.cg.shared.global.L2::cache_hint [sdst], [%1], 16, %2;\n}\n" ::"l"(smem),
      "l"(gmem), "l"(policy)
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
