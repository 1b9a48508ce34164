// Fused residual add + RMSNorm + router GEMV + few-token routing (see moe_norm_router.h).
//
// Grid: ceil(E / R) CTAs of 256 threads; CTA b owns router rows [b·R, b·R + R). No grid-wide
// barrier before the GEMV: EVERY CTA normalizes all T token rows itself (4·T·H bytes from L2,
// staged in shared memory with cp.async), so each has the full x. Phases of a CTA:
//   0. before the PDL wait: its R router rows and the norm weight into registers (constants),
//   1. h and residual rows of all tokens → shared memory (all copies in flight at once),
//   2. per token: s = h + r in fp32, sum of squares of the unrounded s, bf16(s) kept in shared
//      memory; per-token block sums reduced exactly as rms_norm's block_sum does,
//   3. x = bf16(s) · inv_rms · w into shared memory; CTA 0 alone also stores x to global,
//   4. its R logits of every token: per-thread fp32 dot products over the thread's 8-column
//      chunks (the chunks of the norm), warp butterfly, the 8 warps summed in order,
//   5. arrival counter: the last CTA to arrive stores the residual (only it knows every CTA has
//      read the old one) and runs routing::few_tokens_routing on the logits of all CTAs.
// Thread i owns columns 8·(i + 256·v) .. +8 for v < V in every phase, the assignment of
// rms_norm's one-pass kernel with 256 threads, so the normed rows are bit-identical to it.
#include "kernels/cuda/moe/moe_norm_router.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "base/error.h"
#include "kernels/cuda/gemm/row_stream.cuh"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/misc/smem_opt_in.h"
#include "kernels/cuda/moe/moe_routing_device.cuh"

namespace serval::kernels::cuda {

namespace {

constexpr int kThreads = routing::kSmallThreads;  // few_tokens_routing needs exactly this CTA
constexpr int kWarps = kThreads / 32;
constexpr int kMaxTokens = kMoeNormRouterMaxTokens;
constexpr int kMaxVecs = 4;           // 16-byte chunks per thread and row: hidden ≤ 8192
constexpr int kMaxRows = 4;           // router rows per CTA
constexpr int kMaxSmem = 128 * 1024;  // dynamic shared memory: 4·T·H bytes
static_assert(kMaxTokens <= routing::kSmallMaxTokens, "one routing warp per token");

// Arrival counter: zero at module load; the last CTA of a launch resets it. The next launch
// touches it only after its PDL wait, when this launch has completed.
__device__ unsigned int g_norm_router_arrivals;

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}

__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// R router rows per CTA, V 16-byte chunks per thread and row (hidden ≤ 8·256·V).
template <int R, int V>
__global__ void __launch_bounds__(kThreads) norm_router_kernel(MoeNormRouterParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float s_sq[kMaxTokens][kWarps];      // per-warp sums of squares
  __shared__ float s_dot[kWarps][kMaxTokens][R];  // per-warp partial logits
  __shared__ int s_last;
  const int T = p.routing.num_tokens, H = p.hidden, E = p.routing.num_experts;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int num_vecs = H / 8;
  const int row0 = blockIdx.x * R;

  // 0. Constants before the wait.
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
  pdl_launch_dependents();

  // 1. Stage h and residual rows. Each thread later reads back only the chunks it copied, so
  // waiting for its own copies is enough (no barrier).
  __nv_bfloat16* s_x = reinterpret_cast<__nv_bfloat16*>(smem);  // [T][H]: h, then x
  __nv_bfloat16* s_r = s_x + size_t(T) * H;                     // [T][H]: residual, then bf16(s)
  const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(p.h);
  __nv_bfloat16* residual = reinterpret_cast<__nv_bfloat16*>(p.residual);
  for (int t = 0; t < T; ++t)
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const int vec = tid + i * kThreads;
      if (vec >= num_vecs) continue;
      const size_t at = size_t(t) * H + vec * 8;
      cp_async16(s_x + at, h + at);
      cp_async16(s_r + at, residual + at);
    }
  cp_async_wait_all();

  // 2. Residual sums and per-warp sums of squares (rms_norm_reg_kernel's order per thread).
  for (int t = 0; t < T; ++t) {
    float sum_sq = 0.0f;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const int vec = tid + i * kThreads;
      if (vec >= num_vecs) continue;
      const size_t at = size_t(t) * H + vec * 8;
      float v[8], r[8];
      load8(s_x + at, v);
      load8(s_r + at, r);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] += r[j];
      store8(s_r + at, v);  // bf16-rounded, as rms_norm stores the residual
#pragma unroll
      for (int j = 0; j < 8; ++j) sum_sq += v[j] * v[j];
    }
    sum_sq = warp_sum(sum_sq);
    if (lane == 0) s_sq[t][warp] = sum_sq;
  }
  __syncthreads();

  // 3. Normed rows. The block total is block_sum's second stage (lanes ≥ kWarps add zeros; a
  // narrower rms_norm CTA has fewer warps whose missing partials are the same zeros).
  __nv_bfloat16* x_out = reinterpret_cast<__nv_bfloat16*>(p.x);
  for (int t = 0; t < T; ++t) {
    const float total = warp_sum(lane < kWarps ? s_sq[t][lane] : 0.0f);
    const float inv = rsqrtf(total / float(H) + p.eps);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const int vec = tid + i * kThreads;
      if (vec >= num_vecs) continue;
      const size_t at = size_t(t) * H + vec * 8;
      float v[8];
      load8(s_r + at, v);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = v[j] * inv * nw[i][j];
      store8(s_x + at, v);
      if (blockIdx.x == 0) store8(x_out + at, v);
    }
  }

  // 4. Logits of this CTA's rows (x chunks are the thread's own: no barrier before reading).
  for (int t = 0; t < T; ++t) {
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const int vec = tid + i * kThreads;
      if (vec >= num_vecs) continue;
      float xv[8];
      load8(s_x + size_t(t) * H + vec * 8, xv);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = dot8_bf16(wr[r][i], xv, acc[r]);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float s = warp_sum(acc[r]);
      if (lane == 0) s_dot[warp][t][r] = s;
    }
  }
  __syncthreads();
  if (tid < T * R) {
    const int t = tid / R, r = tid % R, row = row0 + r;
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += s_dot[w][t][r];
    if (row < E) p.logits[size_t(t) * E + row] = s;
    __threadfence();  // this thread's logit is visible before the CTA's arrival is counted
  }
  __syncthreads();

  // 5. The last CTA to arrive: residual (in place: once every CTA has read the old rows) and
  // routing.
  if (tid == 0) {
    __threadfence();
    s_last = atomicAdd(&g_norm_router_arrivals, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!s_last) return;
  if (tid == 0) g_norm_router_arrivals = 0;  // for the next launch (or graph replay)
  __threadfence();                           // the other CTAs' logits before reading them
  for (int t = 0; t < T; ++t)
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const int vec = tid + i * kThreads;
      if (vec >= num_vecs) continue;
      const size_t at = size_t(t) * H + vec * 8;
      *reinterpret_cast<uint4*>(residual + at) = *reinterpret_cast<const uint4*>(s_r + at);
    }
  if (p.logits_only) return;  // the consumer routes (MoeNormRouterParams::logits_only)
  MoeRoutingParams rp = p.routing;
  rp.logits = p.logits;
  routing::few_tokens_routing(rp);
}

using Kernel = void (*)(MoeNormRouterParams);

// Rows per CTA: grids of at most 64 CTAs (E ≤ 64: one row each; 128 experts: 64 CTAs of 2).
int rows_per_cta(int experts) {
  return experts <= 64 ? 1 : experts <= 128 ? 2 : kMaxRows;
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
  const long smem = 4L * r.num_tokens * p.hidden;
  return r.num_tokens >= 1 && r.num_tokens <= kMaxTokens && p.hidden > 0 && p.hidden % 8 == 0 &&
         p.hidden <= 8 * kThreads * kMaxVecs && smem <= kMaxSmem && r.num_experts >= 1 &&
         r.num_experts <= kMoeMaxExperts && r.top_k >= 1 && r.top_k <= kMoeMaxTopK &&
         r.num_local >= 0 && r.num_local <= kMoeMaxExperts && is_aligned16(p.h) &&
         is_aligned16(p.residual) && is_aligned16(p.norm_weight) && is_aligned16(p.router) &&
         is_aligned16(p.x);
}

void moe_norm_router_topk(const MoeNormRouterParams& p, cudaStream_t stream) {
  if (!moe_norm_router_supported(p) || p.logits == nullptr)
    throw InvalidArgument(
        "moe_norm_router_topk: need 1 <= tokens <= " + std::to_string(kMaxTokens) +
        ", hidden % 8 == 0, hidden <= 8192, 4·tokens·hidden <= 128 KB, experts <= " +
        std::to_string(kMoeMaxExperts) + " and 16-byte aligned rows (got tokens " +
        std::to_string(p.routing.num_tokens) + ", hidden " + std::to_string(p.hidden) +
        ", experts " + std::to_string(p.routing.num_experts) + ")");
  moe_routing_check(p.routing);
  const int r = rows_per_cta(p.routing.num_experts), v = vecs_per_thread(p.hidden);
  const Kernel kernel = pick(r, v);
  const size_t smem = size_t(4) * p.routing.num_tokens * p.hidden;
  // Always opted in: the static shared memory counts towards the 48 KB default as well.
  allow_dynamic_smem(kernel, size_t(kMaxSmem), "moe_norm_router_topk");
  const unsigned grid = unsigned((p.routing.num_experts + r - 1) / r);
  launch_pdl("moe_norm_router_topk", kernel, dim3(grid), dim3(kThreads), smem, stream, p);
}

}  // namespace serval::kernels::cuda
