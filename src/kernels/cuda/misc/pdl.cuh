// Programmatic dependent launch (PDL, sm_90+). A kernel launched with launch_pdl may be scheduled
// while the previous kernel in the stream is still draining, which hides most of the ~1 µs gap
// between dependent kernels of a decode step (PERF.md: ~500 kernels per step).
//
// Contract for every kernel launched with launch_pdl:
//   - call pdl_wait() in every thread before its first access to memory written or read by an
//     earlier kernel of the step (activations, workspaces, metadata, the KV cache), and before
//     any early return: a grid that completes without waiting would let the next kernel run
//     ahead of the one before it. Reading weights (constant during a step) may come first, which
//     is how a GEMV streams its weights while the producer of its input finishes.
//   - pdl_launch_dependents() is optional: it lets the next kernel start its prologue before this
//     grid ends (otherwise that happens as this grid's blocks exit).
// pdl_wait() returns at once when the kernel was launched normally, so the same kernel works with
// either launch.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/misc/device_utils.cuh"

namespace serval::kernels::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization, in
// clusters of `cluster_x` CTAs along x when it is above 1 (grid.x a multiple of it); throws
// serval::Error naming `name` if the launch fails.
template <typename... KernelArgs, typename... Args>
void launch_pdl_cluster(const char* name, void (*kernel)(KernelArgs...), dim3 grid, dim3 block,
                        unsigned cluster_x, size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attributes[2] = {};
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = 1;
  attributes[1].id = cudaLaunchAttributeClusterDimension;
  attributes[1].val.clusterDim.x = cluster_x;
  attributes[1].val.clusterDim.y = 1;
  attributes[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = cluster_x > 1 ? 2 : 1;
  cudaError_t e = cudaLaunchKernelEx(&config, kernel, KernelArgs(std::forward<Args>(args))...);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error(std::string("CUDA kernel ") + name + " failed to launch: " + cudaGetErrorString(e));
  }
}

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization; throws
// serval::Error naming `name` if the launch fails.
template <typename... KernelArgs, typename... Args>
void launch_pdl(const char* name, void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                cudaStream_t stream, Args&&... args) {
  launch_pdl_cluster(name, kernel, grid, block, 1, smem, stream, std::forward<Args>(args)...);
}

}  // namespace serval::kernels::cuda
