// MoE expert GEMVs for a few tokens (see moe_gemv.h). One warp per output value: gate_up warps
// stream the gate and up rows of one (pair, channel); down warps stream the top_k down rows of
// one (token, hidden channel), one row per choice, each against that choice's activation row.
#include "kernels/cuda/moe/moe_gemv.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "base/error.h"
#include "kernels/cuda/gemm/row_stream.cuh"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"

namespace serval::kernels::cuda {

namespace {

constexpr int kWarps = 4;  // warps per CTA

// Local expert of pair p, or −1.
__device__ __forceinline__ int local_expert(const MoeGemvParams& p, int pair) {
  const int e = p.topk_ids[pair] - p.local_offset;
  return e >= 0 && e < p.num_local ? e : -1;
}

// Warp w = pair · inter + c. Stages of 4 slices (1024 columns) per row.
__global__ void __launch_bounds__(kWarps * 32) moe_gemv_gate_up_kernel(MoeGemvParams p) {
  const int lane = threadIdx.x & 31;
  const int w = blockIdx.x * kWarps + (threadIdx.x >> 5);
  pdl_wait();  // the expert ids come from the routing kernel
  const int pairs = p.num_tokens * p.top_k;
  if (w >= pairs * p.inter) return;  // no barriers in this kernel
  const int pair = w / p.inter, c = w % p.inter;
  const int e = local_expert(p, pair);
  if (e < 0) return;
  const __nv_bfloat16* gu = reinterpret_cast<const __nv_bfloat16*>(p.gate_up);
  const __nv_bfloat16* rows[2] = {gu + (size_t(e) * 2 * p.inter + c) * p.hidden,
                                  gu + (size_t(e) * 2 * p.inter + p.inter + c) * p.hidden};
  RowStream<2, 4> stream;
  stream.start(rows, p.hidden, lane);
  const __nv_bfloat16* x =
      reinterpret_cast<const __nv_bfloat16*>(p.x) + size_t(pair / p.top_k) * p.hidden;
  float acc[1][2] = {};
  stream.accumulate<1, false>([&](int, int) { return x; }, acc);
  const float g = warp_sum(acc[0][0]), u = warp_sum(acc[0][1]);
  if (lane == 0)
    reinterpret_cast<__nv_bfloat16*>(p.act)[size_t(pair) * p.inter + c] =
        __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
}

// Warp w = token · hidden + h; R ≥ top_k rows (choices ≥ top_k and non-local ones are streamed
// from a valid row and skipped), 8/R slices per stage (64 registers of weights per lane).
template <int R>
__global__ void __launch_bounds__(kWarps * 32) moe_gemv_down_kernel(MoeGemvParams p) {
  const int lane = threadIdx.x & 31;
  const int w = blockIdx.x * kWarps + (threadIdx.x >> 5);
  pdl_wait();  // act from the gate_up kernel, ids and weights from routing
  if (w >= p.num_tokens * p.hidden) return;  // no barriers in this kernel
  const int t = w / p.hidden, h = w % p.hidden;
  const __nv_bfloat16* down = reinterpret_cast<const __nv_bfloat16*>(p.down);
  const __nv_bfloat16* act = reinterpret_cast<const __nv_bfloat16*>(p.act);
  const __nv_bfloat16* rows[R];
  int expert[R];
#pragma unroll
  for (int j = 0; j < R; ++j) {
    expert[j] = j < p.top_k ? local_expert(p, t * p.top_k + j) : -1;
    rows[j] = down + (size_t(max(expert[j], 0)) * p.hidden + h) * p.inter;
  }
  RowStream<R, 8 / R> stream;
  stream.start(rows, p.inter, lane);
  float acc[1][R] = {};
  stream.accumulate<1, true>(
      [&](int, int j) { return act + size_t(t * p.top_k + min(j, p.top_k - 1)) * p.inter; }, acc);
  float total = 0.0f;
#pragma unroll
  for (int j = 0; j < R; ++j) {
    const float y = warp_sum(acc[0][j]);  // every lane reduces: shuffles need the whole warp
    if (expert[j] >= 0)
      total += p.topk_weights[t * p.top_k + j] * __bfloat162float(__float2bfloat16_rn(y));
  }
  if (lane == 0)
    reinterpret_cast<__nv_bfloat16*>(p.out)[size_t(t) * p.hidden + h] = __float2bfloat16_rn(total);
}

unsigned ctas(long warps) {
  return unsigned((warps + kWarps - 1) / kWarps);
}

}  // namespace

bool moe_gemv_supported(int num_tokens, int top_k, int hidden, int inter) {
  return num_tokens >= 1 && num_tokens <= kMoeGemvMaxTokens && top_k >= 1 &&
         top_k <= kMoeGemvMaxTopK && hidden > 0 && hidden % 8 == 0 && inter > 0 && inter % 8 == 0;
}

void moe_gemv(const MoeGemvParams& p, cudaStream_t stream) {
  if (!moe_gemv_supported(p.num_tokens, p.top_k, p.hidden, p.inter) || !is_aligned16(p.x) ||
      !is_aligned16(p.gate_up) || !is_aligned16(p.down) || !is_aligned16(p.act))
    throw InvalidArgument("moe_gemv: need 1 <= tokens <= " + std::to_string(kMoeGemvMaxTokens) +
                          ", 1 <= top_k <= " + std::to_string(kMoeGemvMaxTopK) +
                          ", hidden and inter multiples of 8 and 16-byte aligned buffers; got " +
                          std::to_string(p.num_tokens) + " tokens, top_k " +
                          std::to_string(p.top_k) + ", hidden " + std::to_string(p.hidden) +
                          ", inter " + std::to_string(p.inter));
  const dim3 block(kWarps * 32);
  launch_pdl("moe_gemv_gate_up", moe_gemv_gate_up_kernel,
             dim3(ctas(long(p.num_tokens) * p.top_k * p.inter)), block, 0, stream, p);
  const dim3 grid(ctas(long(p.num_tokens) * p.hidden));
  if (p.top_k <= 2) {
    launch_pdl("moe_gemv_down", moe_gemv_down_kernel<2>, grid, block, 0, stream, p);
  } else if (p.top_k <= 4) {
    launch_pdl("moe_gemv_down", moe_gemv_down_kernel<4>, grid, block, 0, stream, p);
  } else {
    launch_pdl("moe_gemv_down", moe_gemv_down_kernel<8>, grid, block, 0, stream, p);
  }
}

}  // namespace serval::kernels::cuda
