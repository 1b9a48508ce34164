// All-reduce fused with the residual add and RMSNorm that follow every row-parallel layer of a
// tensor-parallel decoder (o_proj, down_proj):
//   residual ← residual + bf16(Σ_r delta_r)      (fp32 sum in rank order 0..N-1, rounded once)
//   x        ← RMSNorm(residual) · weight         (as kernels/cuda/norm_rope/rms_norm.h computes
//   it)
// in one kernel per rank, on the blocks of p2p_all_reduce.h (the same call counters, flags and
// counters, so plain and fused calls may alternate, and the blocks' low-latency staging). Push,
// not pull, and no flags: CTA b owns rows b, b + 32, … and stores this rank's delta rows straight
// into every peer's staging (one NVLink crossing) as 8-byte words of payload and call number, then
// polls its own staging until the peers' words show the call. Every rank computes the same bits.
// Launched with programmatic dependent launch: the norm weight is read before the wait; capturable
// in CUDA graphs.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"

namespace serval::kernels::cuda {

struct P2pAllReduceNormParams {
  const bf16* delta;   // [rows, hidden] this rank's partial sums (read only)
  bf16* residual;      // [rows, hidden] in/out, the same on every rank
  const bf16* weight;  // [hidden]
  bf16* out;           // [rows, hidden] normalized output
  int rows, hidden;
  float eps;
  int rank, ranks;
  size_t max_bytes;                  // of the blocks (p2p_all_reduce.h)
  uint8_t* block;                    // this rank's block
  const volatile uint32_t* aborted;  // the group's host-mapped abort word
};

// True when the shapes fit: hidden % 8 == 0 and ≤ 16384, ranks · rows · hidden · 4 ≤ max_bytes,
// 16-byte aligned rows, 2..kP2pMaxRanks ranks.
bool p2p_all_reduce_norm_supported(const P2pAllReduceNormParams& p);

// Throws InvalidArgument unless supported.
void p2p_all_reduce_norm(const P2pAllReduceNormParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
