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

// Marks between ops, and inside an op that launches several kernels (e.g. the MoE experts'
// gate_up, then down): while the op timeline runs it registers a sink for its stream, and
// timeline_mark(what, stream) then marks that stream as if an op `what` (a string literal) had
// just ended. Without a sink for the stream (the default) it does nothing; the check costs one
// atomic load.
using TimelineSink = void (*)(void* ctx, const char* what, cudaStream_t stream);
void add_timeline_sink(cudaStream_t stream, TimelineSink sink, void* ctx);  // replaces any
void remove_timeline_sinks(void* ctx);  // every stream's sink with this ctx
void timeline_mark(const char* what, cudaStream_t stream);

}  // namespace serval::kernels::cuda
