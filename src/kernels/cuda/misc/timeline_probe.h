// A one-thread kernel that stores the GPU's nanosecond clock (%globaltimer) once the kernels
// before it on the stream have completed: marks between a step's ops, for a timeline of a decode
// step as it runs (graphs and programmatic dependent launch included; backend/cuda/op_timeline.h).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace serval::kernels::cuda {

// *slot = %globaltimer after the previous kernel completes. Launched with programmatic dependent
// launch: it lets the next kernel start at once and waits for the previous one itself, so the
// chain keeps its overlap and the next kernel's wait still covers everything before the probe.
void timeline_probe(uint64_t* slot, cudaStream_t stream);

}  // namespace serval::kernels::cuda
