// Fused residual add + RMSNorm + router GEMV + few-token routing (see moe_norm_router.h).
//
// Grid (⌈E / R⌉, T) of 256-thread CTAs; CTA (b, t) owns router rows [b·R, b·R + R) of token t. No
// grid-wide barrier before the GEMV: every CTA normalizes its token's row itself (4·H bytes from
// L2), held in registers. Phases of a CTA:
//   0. before the PDL wait: its R router rows and the norm weight into registers (constants),
//   1. token t's h and residual chunks; s = h + r in fp32, the sum of squares of the unrounded s
//      reduced exactly as rms_norm's block_sum does; bf16(s) kept,
//   2. x = bf16(s) · inv_rms · w (bf16-rounded); the CTAs with b = 0 store x to global,
//   3. its R logits: per-thread fp32 dot products over the thread's 8-column chunks, warp
//      butterfly, the 8 warps summed in order,
//   4. per-token arrival (counted once every thread has its old residual chunks): the last CTA of
//      token t stores the row's residual,
//   5. grid arrival: the last CTA runs routing::few_tokens_routing on the logits of all CTAs.
// Thread i owns columns 8·(i + 256·v) .. +8 for v < V in every phase, the assignment of
// rms_norm's one-pass kernel with 256 threads, so the normed rows are bit-identical to it.
// One token per CTA (not all T tokens' rows in every CTA, which measured slower than the unfused
// kernels at 8 tokens): Qwen3-30B NVFP4 b8 TPOT 4.76-4.81 ms vs 5.01 unfused on the H200.
#include "kernels/cuda/moe/moe_norm_router.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "base/error.h"
#include "kernels/cuda/gemm/row_stream.cuh"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/moe/moe_routing_device.cuh"

namespace serval::kernels::cuda {

namespace {

constexpr int kThreads = routing::kSmallThreads;  // few_tokens_routing needs exactly this CTA
constexpr int kWarps = kThreads / 32;
constexpr int kMaxTokens = kMoeNormRouterMaxTokens;
constexpr int kMaxVecs = 4;  // 16-byte chunks per thread and row: hidden ≤ 8192
constexpr int kMaxRows = 4;  // router rows per CTA
static_assert(kMaxTokens <= routing::kSmallMaxTokens, "one routing warp per token");

// Arrival counters: zero at module load; the last CTA of a token (of the grid) resets its
// counter. The next launch touches them only after its PDL wait, when this launch has completed.
__device__ unsigned int g_norm_router_token_arrivals[kMaxTokens];
__device__ unsigned int g_norm_router_grid_arrivals;

// R router rows per CTA, V 16-byte chunks per thread (hidden ≤ 8·256·V).
template <int R, int V>
__global__ void __launch_bounds__(kThreads) norm_router_kernel(MoeNormRouterParams p) {
  __shared__ float s_sq[kWarps];
  __shared__ float s_dot[kWarps][R];
  __shared__ int s_row_last, s_last;
  const int H = p.hidden, E = p.routing.num_experts;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int num_vecs = H / 8, t = blockIdx.y, row0 = blockIdx.x * R;

  // Constants before the wait: this CTA's router rows and the norm weight.
  const __nv_bfloat16* router = reinterpret_cast<const __nv_bfloat16*>(p.router);
  uint4 wr[R][V];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const int vec = tid + i * kThreads, row = row0 + r;
      wr[r][i] = vec < num_vecs && row < E ? ld_stream16(router + size_t(row) * H + vec * 8)
                                           : make_uint4(0, 0, 0, 0);
    }
  float nw[V][8];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int vec = tid + i * kThreads;
    if (vec < num_vecs)
      load8(reinterpret_cast<const __nv_bfloat16*>(p.norm_weight) + vec * 8, nw[i]);
  }
  pdl_wait();
  // With logits_only the consumers (the NVFP4 expert GEMVs) route themselves: they may start
  // now. Otherwise they launch when the routing CTA starts (below).
  if (p.logits_only) pdl_launch_dependents();

  // Token t's h and residual chunks (all loads before any use), the fp32 sums and their squares.
  const size_t row_at = size_t(t) * H;
  const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(p.h);
  __nv_bfloat16* residual = reinterpret_cast<__nv_bfloat16*>(p.residual);
  float v[V][8], rv[V][8];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int vec = tid + i * kThreads;
    if (vec >= num_vecs) continue;
    load8(h + row_at + vec * 8, v[i]);
    load8(residual + row_at + vec * 8, rv[i]);
  }
  float sum_sq = 0.0f;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int vec = tid + i * kThreads;
    if (vec >= num_vecs) continue;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      v[i][j] += rv[i][j];
      sum_sq += v[i][j] * v[i][j];
      v[i][j] = __bfloat162float(__float2bfloat16_rn(v[i][j]));  // the stored residual
    }
  }
  sum_sq = warp_sum(sum_sq);
  if (lane == 0) s_sq[warp] = sum_sq;
  __syncthreads();  // every thread has read its old residual chunks
  if (tid == 0) s_row_last = atomicAdd(&g_norm_router_token_arrivals[t], 1u) == gridDim.x - 1;
  const float inv = rsqrtf(warp_sum(lane < kWarps ? s_sq[lane] : 0.0f) / float(H) + p.eps);

  // Normed chunks (bf16-rounded, as stored) and this CTA's R logits.
  __nv_bfloat16* x_out = reinterpret_cast<__nv_bfloat16*>(p.x);
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int vec = tid + i * kThreads;
    if (vec >= num_vecs) continue;
    float xv[8];
#pragma unroll
    for (int j = 0; j < 8; ++j)
      xv[j] = __bfloat162float(__float2bfloat16_rn(v[i][j] * inv * nw[i][j]));
    if (blockIdx.x == 0) store8(x_out + row_at + vec * 8, xv);
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = dot8_bf16(wr[r][i], xv, acc[r]);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float sum = warp_sum(acc[r]);
    if (lane == 0) s_dot[warp][r] = sum;
  }
  __syncthreads();
  if (s_row_last) {  // every CTA of token t has read the old residual row: store the new one
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const int vec = tid + i * kThreads;
      if (vec < num_vecs) store8(residual + row_at + vec * 8, v[i]);
    }
    if (tid == 0) g_norm_router_token_arrivals[t] = 0;  // for the next launch (or graph replay)
  }
  if (tid < R) {
    const int row = row0 + tid;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += s_dot[w][tid];
    if (row < E) p.logits[size_t(t) * E + row] = sum;
  }
  if (p.logits_only) return;

  // The last CTA of the grid routes from every CTA's logits.
  __syncthreads();  // this CTA's logits before thread 0's arrival, which releases them
  if (tid == 0) s_last = arrive_acq_rel(&g_norm_router_grid_arrivals) == gridDim.x * gridDim.y - 1;
  __syncthreads();  // thread 0 acquired the other CTAs' logits: every thread reads after it
  if (!s_last) return;
  // The expert kernels launch once every other CTA has exited, on an idle GPU: launched while
  // this grid's CTAs still held SMs, the grouped GEMM's CTAs landed unevenly and ran 30 % longer
  // at 6 tokens on the H200 (Qwen3-30B NVFP4 b6 TPOT 4.62 vs 4.14 ms). At one token with
  // logits_only the early launch is the faster (b1 2.14 vs 2.19 ms).
  pdl_launch_dependents();
  if (tid == 0) g_norm_router_grid_arrivals = 0;
  MoeRoutingParams rp = p.routing;
  rp.logits = p.logits;
  routing::few_tokens_routing(rp);
}

using Kernel = void (*)(MoeNormRouterParams);

// Rows per CTA: one row per CTA up to 64 experts, 2 up to 128, else 4; more (up to kMaxRows)
// while the grid of T·⌈E / R⌉ CTAs exceeds 256 (every token's CTAs read all router rows: more
// CTAs add row reads, not weight reads).
int rows_per_cta(int experts, int tokens) {
  int r = experts <= 64 ? 1 : experts <= 128 ? 2 : kMaxRows;
  while (r < kMaxRows && tokens * ((experts + r - 1) / r) > 256) r *= 2;
  return r;
}

int vecs_per_thread(int hidden) {
  const int v = (hidden / 8 + kThreads - 1) / kThreads;
  return v <= 1 ? 1 : v == 2 ? 2 : kMaxVecs;
}

template <int R>
Kernel pick_v(int v) {
  return v == 1   ? norm_router_kernel<R, 1>
         : v == 2 ? norm_router_kernel<R, 2>
                  : norm_router_kernel<R, kMaxVecs>;
}

Kernel pick(int r, int v) {
  return r == 1 ? pick_v<1>(v) : r == 2 ? pick_v<2>(v) : pick_v<kMaxRows>(v);
}

}  // namespace

bool moe_norm_router_supported(const MoeNormRouterParams& p) {
  const MoeRoutingParams& r = p.routing;
  return r.num_tokens >= 1 && r.num_tokens <= kMaxTokens && p.hidden > 0 && p.hidden % 8 == 0 &&
         p.hidden <= 8 * kThreads * kMaxVecs && r.num_experts >= 1 &&
         r.num_experts <= kMoeMaxExperts && r.top_k >= 1 && r.top_k <= kMoeMaxTopK &&
         r.num_local >= 0 && r.num_local <= kMoeMaxExperts && is_aligned16(p.h) &&
         is_aligned16(p.residual) && is_aligned16(p.norm_weight) && is_aligned16(p.router) &&
         is_aligned16(p.x);
}

void moe_norm_router_topk(const MoeNormRouterParams& p, cudaStream_t stream) {
  if (!moe_norm_router_supported(p) || p.logits == nullptr)
    throw InvalidArgument(
        "moe_norm_router_topk: need 1 <= tokens <= " + std::to_string(kMaxTokens) +
        ", hidden % 8 == 0, hidden <= 8192, experts <= " + std::to_string(kMoeMaxExperts) +
        " and 16-byte aligned rows (got tokens " + std::to_string(p.routing.num_tokens) +
        ", hidden " + std::to_string(p.hidden) + ", experts " +
        std::to_string(p.routing.num_experts) + ")");
  moe_routing_check(p.routing);
  const int T = p.routing.num_tokens, E = p.routing.num_experts;
  const int r = rows_per_cta(E, T);
  launch_pdl("moe_norm_router_topk", pick(r, vecs_per_thread(p.hidden)),
             dim3(unsigned((E + r - 1) / r), unsigned(T)), dim3(kThreads), 0, stream, p);
}

}  // namespace serval::kernels::cuda
