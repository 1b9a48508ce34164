// MoE expert GEMVs for a few tokens (see moe_gemv.h), on RowStream (row_stream.cuh): each output
// value is one item of one warp; grids are sized to the resident warps, which take every W-th
// item so a warp's next rows are in flight while it finishes the current ones.
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

// Item = (pair, channel c) = pair · inter + c: the gate and up rows of c. Warp w of W takes
// items w, w + W, ...; stages of 4 slices (1024 columns).
__global__ void __launch_bounds__(kWarps * 32) moe_gemv_gate_up_kernel(MoeGemvParams p) {
  const int lane = threadIdx.x & 31;
  const int warp = blockIdx.x * kWarps + (threadIdx.x >> 5), warps = gridDim.x * kWarps;
  pdl_wait();  // the expert ids come from the routing kernel
  const __nv_bfloat16* gu = reinterpret_cast<const __nv_bfloat16*>(p.gate_up);
  const __nv_bfloat16* xb = reinterpret_cast<const __nv_bfloat16*>(p.x);
  const int total = p.num_tokens * p.top_k * p.inter;
  auto item_of = [&](int i) { return warp + i * warps; };
  // Non-local pairs stream expert 0's rows and store nothing (warp-uniform, no divergence).
  auto rows_of = [&](int i, const __nv_bfloat16*(&rows)[2]) {
    const int it = item_of(i), pair = it / p.inter, c = it % p.inter;
    const int e = max(local_expert(p, pair), 0);
    rows[0] = gu + (size_t(e) * 2 * p.inter + c) * p.hidden;
    rows[1] = gu + (size_t(e) * 2 * p.inter + p.inter + c) * p.hidden;
  };
  RowStream<2, 4, decltype(rows_of)> stream(rows_of, row_stream_items(total, warp, warps), p.hidden,
                                            lane);
  stream.start();
  stream.template run<1, false>(
      [&](int i, int, int) { return xb + size_t(item_of(i) / p.inter / p.top_k) * p.hidden; },
      [&](int i, float(&acc)[1][2]) {
        const float g = warp_sum(acc[0][0]), u = warp_sum(acc[0][1]);
        const int it = item_of(i);
        if (lane == 0 && local_expert(p, it / p.inter) >= 0)
          reinterpret_cast<__nv_bfloat16*>(p.act)[it] =
              __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
      });
}

// Item = (token t, hidden channel h) = t · hidden + h: R ≥ top_k down rows, one per choice, each
// against that choice's activation row (choices ≥ top_k and non-local ones stream a valid row and
// are skipped); 8/R slices per stage (64 registers of weights per lane).
template <int R>
__global__ void __launch_bounds__(kWarps * 32) moe_gemv_down_kernel(MoeGemvParams p) {
  const int lane = threadIdx.x & 31;
  const int warp = blockIdx.x * kWarps + (threadIdx.x >> 5), warps = gridDim.x * kWarps;
  pdl_wait();  // act from the gate_up kernel, ids and weights from routing
  const __nv_bfloat16* down = reinterpret_cast<const __nv_bfloat16*>(p.down);
  const __nv_bfloat16* act = reinterpret_cast<const __nv_bfloat16*>(p.act);
  auto item_of = [&](int i) { return warp + i * warps; };
  auto expert_of = [&](int t, int j) {
    return j < p.top_k ? local_expert(p, t * p.top_k + j) : -1;
  };
  auto rows_of = [&](int i, const __nv_bfloat16*(&rows)[R]) {
    const int it = item_of(i), t = it / p.hidden, h = it % p.hidden;
#pragma unroll
    for (int j = 0; j < R; ++j)
      rows[j] = down + (size_t(max(expert_of(t, j), 0)) * p.hidden + h) * p.inter;
  };
  RowStream<R, 8 / R, decltype(rows_of)> stream(
      rows_of, row_stream_items(p.num_tokens * p.hidden, warp, warps), p.inter, lane);
  stream.start();
  stream.template run<1, true>(
      [&](int i, int, int j) {
        const int t = item_of(i) / p.hidden;
        return act + size_t(t * p.top_k + min(j, p.top_k - 1)) * p.inter;
      },
      [&](int i, float(&acc)[1][R]) {
        const int it = item_of(i), t = it / p.hidden;
        float total = 0.0f;
#pragma unroll
        for (int j = 0; j < R; ++j) {
          const float y = warp_sum(acc[0][j]);  // every lane reduces: shuffles need the warp
          if (expert_of(t, j) >= 0)
            total += p.topk_weights[t * p.top_k + j] * __bfloat162float(__float2bfloat16_rn(y));
        }
        if (lane == 0) reinterpret_cast<__nv_bfloat16*>(p.out)[it] = __float2bfloat16_rn(total);
      });
}

template <typename Kernel>
void launch(const char* name, Kernel kernel, int ctas_per_sm, long items, const MoeGemvParams& p,
            cudaStream_t stream) {
  launch_pdl(name, kernel, dim3(row_stream_ctas(ctas_per_sm, kWarps, items)), dim3(kWarps * 32), 0,
             stream, p);
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
  static const int gate_up_per_sm = row_stream_ctas_per_sm(moe_gemv_gate_up_kernel, kWarps);
  static const int down2_per_sm = row_stream_ctas_per_sm(moe_gemv_down_kernel<2>, kWarps);
  static const int down4_per_sm = row_stream_ctas_per_sm(moe_gemv_down_kernel<4>, kWarps);
  static const int down8_per_sm = row_stream_ctas_per_sm(moe_gemv_down_kernel<8>, kWarps);
  launch("moe_gemv_gate_up", moe_gemv_gate_up_kernel, gate_up_per_sm,
         long(p.num_tokens) * p.top_k * p.inter, p, stream);
  const long items = long(p.num_tokens) * p.hidden;
  if (p.top_k <= 2) {
    launch("moe_gemv_down", moe_gemv_down_kernel<2>, down2_per_sm, items, p, stream);
  } else if (p.top_k <= 4) {
    launch("moe_gemv_down", moe_gemv_down_kernel<4>, down4_per_sm, items, p, stream);
  } else {
    launch("moe_gemv_down", moe_gemv_down_kernel<8>, down8_per_sm, items, p, stream);
  }
}

}  // namespace serval::kernels::cuda
