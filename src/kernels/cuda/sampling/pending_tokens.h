// Token ids a step takes from the greedy step before it without a host round trip (async
// scheduling): a pending id −(r + 1) in a step's token ids stands for row r of that step's
// sampled ids.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace serval::kernels::cuda {

// ids[i] = sampled[−ids[i] − 1] where ids[i] < 0; other ids stay. The host checks every pending
// id against the rows the previous step sampled before launch (ModelRunner).
struct ResolvePendingTokensParams {
  int32_t* ids;            // [num_ids], device
  const int32_t* sampled;  // [rows of the previous greedy step], device
  int num_ids;
};
// One launch with programmatic dependent launch (pdl.cuh); no-op for num_ids == 0.
void resolve_pending_tokens(const ResolvePendingTokensParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
