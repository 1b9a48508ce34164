// resolve_pending_tokens (pending_tokens.h): one thread per id.
#include <string>

#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/sampling/pending_tokens.h"

namespace serval::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    resolve_pending_tokens_kernel(int32_t* __restrict__ ids, const int32_t* __restrict__ sampled,
                                  int num_ids) {
  pdl_wait();  // the previous step's argmax wrote `sampled`
  const int i = blockIdx.x * kThreads + threadIdx.x;
  if (i >= num_ids) return;
  const int32_t id = ids[i];
  if (id < 0) ids[i] = sampled[-(id + 1)];
}

}  // namespace

void resolve_pending_tokens(const ResolvePendingTokensParams& p, cudaStream_t stream) {
  if (p.num_ids <= 0) return;
  launch_pdl("resolve_pending_tokens", resolve_pending_tokens_kernel,
             unsigned((p.num_ids + kThreads - 1) / kThreads), unsigned(kThreads), 0, stream, p.ids,
             p.sampled, p.num_ids);
}

}  // namespace serval::kernels::cuda
