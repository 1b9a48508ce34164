// bf16 GEMV for 1–4 tokens (see bf16_gemv.h). Item = kRows consecutive weight rows over all of k,
// streamed by RowStream (row_stream.cuh) with the first two stages requested before the PDL wait;
// each lane keeps fp32 sums per (token, row), reduced across the warp with shuffles when the item
// is done. No split-K: every output is one warp's, so the summation order is fixed
// (deterministic, graph replays equal eager runs).
#include "kernels/cuda/gemm/bf16_gemv.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "base/error.h"
#include "kernels/cuda/gemm/bf16_gemv_store.cuh"
#include "kernels/cuda/gemm/row_stream.cuh"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"

namespace serval::kernels::cuda {

namespace {

constexpr int kWarps = 4;    // warps per CTA: small CTAs spread small matrices over more SMs
constexpr int kRows = 2;     // weight rows per item
constexpr int kSlices = 4;   // 256-column slices per stage (1024 columns)
constexpr int kMinCtas = 4;  // ≤ 128 registers: 16 warps per SM, 8 KB of weights in flight each

// M ≥ p.m tokens (tokens ≥ m repeat token m − 1, never stored). Warp w of W takes row pairs
// w, w + W, ...
template <int M>
__global__ void __launch_bounds__(kWarps * 32, kMinCtas) bf16_gemv_kernel(Bf16GemvParams p) {
  const int lane = threadIdx.x & 31;
  const int warp = blockIdx.x * kWarps + (threadIdx.x >> 5), warps = gridDim.x * kWarps;
  const int pairs = (p.n + kRows - 1) / kRows;
  const __nv_bfloat16* wb = reinterpret_cast<const __nv_bfloat16*>(p.w);
  const int k = p.k;
  auto first_row = [&](int i) { return (warp + i * warps) * kRows; };
  auto rows_of = [&](int i, const __nv_bfloat16*(&rows)[kRows]) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) rows[r] = wb + size_t(min(first_row(i) + r, p.n - 1)) * k;
  };
  RowStream<kRows, kSlices, decltype(rows_of)> stream(rows_of, row_stream_items(pairs, warp, warps),
                                                      k, lane);
  stream.start();  // weights only: before the wait
  pdl_wait();
  const __nv_bfloat16* xb = reinterpret_cast<const __nv_bfloat16*>(p.x);
  stream.template run<M, false>([&](int, int t, int) { return xb + size_t(min(t, p.m - 1)) * k; },
                                [&](int i, float(&acc)[M][kRows]) {
                                  // Every lane ends with every total; lane t·kRows + r stores
                                  // (token t, row + r).
                                  const int row0 = first_row(i);
#pragma unroll
                                  for (int t = 0; t < M; ++t)
#pragma unroll
                                    for (int r = 0; r < kRows; ++r) {
                                      const float v = warp_sum(acc[t][r]);
                                      if (lane == t * kRows + r && t < p.m && row0 + r < p.n)
                                        store_gemv_out(p, t, row0 + r, v);
                                    }
                                });
}

template <int M>
void launch(const Bf16GemvParams& p, cudaStream_t stream) {
  static const int per_sm = row_stream_ctas_per_sm(bf16_gemv_kernel<M>, kWarps);
  const long pairs = (p.n + kRows - 1) / kRows;
  launch_pdl("bf16_gemv", bf16_gemv_kernel<M>, dim3(row_stream_ctas(per_sm, kWarps, pairs)),
             dim3(kWarps * 32), 0, stream, p);
}

}  // namespace

bool bf16_gemv_supported(const void* x, const void* w, int m, int k) {
  return m >= 1 && m <= kBf16GemvMaxM && k > 0 && k % 8 == 0 && is_aligned16(x) && is_aligned16(w);
}

void bf16_gemv(const Bf16GemvParams& p, cudaStream_t stream) {
  if (p.n <= 0 || !bf16_gemv_supported(p.x, p.w, p.m, p.k))
    throw InvalidArgument(
        "bf16_gemv: need 1 <= m <= " + std::to_string(kBf16GemvMaxM) +
        ", n > 0, k % 8 == 0 and 16-byte aligned x and w; got m = " + std::to_string(p.m) +
        ", n = " + std::to_string(p.n) + ", k = " + std::to_string(p.k));
  static_assert(kBf16GemvMaxM == 4, "instantiations below cover m <= 4");
  if (p.m == 1) {
    launch<1>(p, stream);
  } else if (p.m == 2) {
    launch<2>(p, stream);
  } else {
    launch<4>(p, stream);
  }
}

}  // namespace serval::kernels::cuda
