// Shared-memory mbarriers (sm_90) for producer/consumer pipelines inside a CTA: a barrier
// completes a phase when `count` arrivals have been made; waiters name the phase by its parity.
#pragma once
#include <cstdint>

namespace serval::kernels::cuda::mbarrier {

// One thread, before any other use; a __syncthreads() must follow before other threads use it.
__device__ __forceinline__ void init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// One arrival (release semantics at CTA scope: this thread's earlier writes are visible to a
// thread whose wait observes the phase complete).
__device__ __forceinline__ void arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar)
               : "memory");
}

// One arrival made once every cp.async this thread issued before has completed (the barrier's
// count includes it: .noinc).
__device__ __forceinline__ void arrive_on_cp_async(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Waits until the phase of parity `parity` has completed (acquire semantics at CTA scope). A
// freshly initialized barrier is in phase 0: waiting for parity 1 returns at once.
__device__ __forceinline__ void wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

}  // namespace serval::kernels::cuda::mbarrier
