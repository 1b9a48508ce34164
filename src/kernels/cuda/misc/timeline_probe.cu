#include "kernels/cuda/misc/timeline_probe.h"

#include "kernels/cuda/misc/pdl.cuh"

namespace serval::kernels::cuda {

namespace {

__global__ void timeline_probe_kernel(uint64_t* slot) {
  pdl_launch_dependents();
  pdl_wait();
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  *slot = now;
}

}  // namespace

void timeline_probe(uint64_t* slot, cudaStream_t stream) {
  launch_pdl("timeline_probe", timeline_probe_kernel, dim3(1), dim3(1), 0, stream, slot);
}

}  // namespace serval::kernels::cuda
