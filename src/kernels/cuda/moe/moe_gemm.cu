// Grouped swap-AB GEMMs on mma.sync m16n8k16 (bf16 → fp32) with a cp.async pipeline, and the
// finalize kernel. See moe_gemm.h for the contract.
#include "kernels/cuda/moe/moe_gemm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "base/error.h"

namespace serval::kernels::cuda {

namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kBK = 64;  // K per pipeline stage: 8 chunks of 16 B per smem row

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  int bytes = valid ? 16 : 0;  // 0 → the 16 bytes are zero-filled, nothing is read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* smem) {
  unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(s));
}

// D(16×8) += A(16×16, row-major) · B(16×8, col-major).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Element offset of 16-byte chunk `chunk` (0..7) of smem row `row`: rows are kBK elements and
// chunks are XOR-swizzled by row % 8, so the 8 rows one ldmatrix reads hit distinct banks.
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * kBK + ((chunk ^ (row & 7)) << 3);
}

// Block tile: BM = 32·WARPS_M weight rows × BN = 8·NI·WARPS_N tokens. Warp (wm, wn) owns
// tile rows [32·wm, 32·wm + 32) as two m16 fragments and NI n8 fragments of tokens.
// GEMM1 row mapping: fragment 0 of warp wm = gate rows of channels ch0 + 16·wm + [0, 16),
// fragment 1 = the up rows of the same channels (ch0 = blockIdx.x · BM/2), so a thread's
// accumulators of fragment 0 and 1 hold gate and up of the same (channel, token).
template <int WARPS_M, int WARPS_N, int NI, int STAGES, bool kGemm1>
__global__ void __launch_bounds__(WARPS_M* WARPS_N * 32) moe_gemm_kernel(MoeGemmParams p) {
  constexpr int kThreads = WARPS_M * WARPS_N * 32;
  constexpr int BM = 32 * WARPS_M, BN = 8 * NI * WARPS_N;
  constexpr int kAChunks = BM * 8 / kThreads;  // 16-byte chunks per thread per stage
  constexpr int kBChunks = (BN * 8 + kThreads - 1) / kThreads;
  static_assert(BM * 8 % kThreads == 0, "A tile chunks divide over threads");

  const int tile = blockIdx.y;
  if (tile >= *p.num_tiles) return;  // whole CTA leaves before any barrier
  const int expert = p.tile_expert[tile];

  extern __shared__ uint4 smem_u4[];
  __nv_bfloat16* sA = reinterpret_cast<__nv_bfloat16*>(smem_u4);
  __nv_bfloat16* sB = sA + STAGES * BM * kBK;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp % WARPS_M, wn = warp / WARPS_M;
  const int K = p.k;
  const int m_rows = kGemm1 ? 2 * p.n_out : p.n_out;
  const __nv_bfloat16* W =
      reinterpret_cast<const __nv_bfloat16*>(p.weights) + size_t(expert) * m_rows * K;
  const __nv_bfloat16* X = reinterpret_cast<const __nv_bfloat16*>(p.input);
  const int row0 = tile * BN;  // first permuted row of this tile

  // Per-thread source rows; chunk column (tid % 8) is the same for all of a thread's chunks.
  const int kc = tid & 7;
  const __nv_bfloat16* a_src[kAChunks];
  int a_dst[kAChunks];
#pragma unroll
  for (int j = 0; j < kAChunks; ++j) {
    const int r = tid / 8 + j * (kThreads / 8);
    int wrow;
    if constexpr (kGemm1) {
      const int w = r / 32, frag = (r % 32) / 16, i = r % 16;
      const int ch = blockIdx.x * (BM / 2) + w * 16 + i;
      wrow = frag == 0 ? ch : p.n_out + ch;
    } else {
      wrow = blockIdx.x * BM + r;
    }
    a_src[j] = W + size_t(wrow) * K + kc * 8;
    a_dst[j] = swz(r, kc);
  }
  const __nv_bfloat16* b_src[kBChunks];
  int b_dst[kBChunks];
  bool b_valid[kBChunks];
#pragma unroll
  for (int j = 0; j < kBChunks; ++j) {
    const int n = tid / 8 + j * (kThreads / 8);
    b_valid[j] = n < BN;
    b_dst[j] = swz(n < BN ? n : 0, kc);
    int src_row = 0;
    if (n < BN) {
      if constexpr (kGemm1) {
        const int tok = p.permuted_to_token[row0 + n];
        b_valid[j] = tok >= 0;
        src_row = tok >= 0 ? tok : 0;
      } else {
        src_row = row0 + n;
      }
    }
    b_src[j] = X + size_t(src_row) * K + kc * 8;
  }

  auto load_stage = [&](int stage, int kt) {
    __nv_bfloat16* a = sA + stage * BM * kBK;
    __nv_bfloat16* b = sB + stage * BN * kBK;
    const int koff = kt * kBK;
#pragma unroll
    for (int j = 0; j < kAChunks; ++j) cp_async16(a + a_dst[j], a_src[j] + koff, true);
#pragma unroll
    for (int j = 0; j < kBChunks; ++j) {
      const int n = tid / 8 + j * (kThreads / 8);
      if (n < BN) cp_async16(b + b_dst[j], b_src[j] + koff, b_valid[j]);
    }
  };

  float acc[2][NI][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mi][ni][q] = 0.0f;

  const int KT = K / kBK;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load_stage(s, s);
    cp_async_commit();
  }

  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<STAGES - 2>();  // stage kt has landed (this thread's copies)
    __syncthreads();              // ... and everyone's; stage kt-1 is free to overwrite
    const int pre = kt + STAGES - 1;
    if (pre < KT) load_stage(pre % STAGES, pre);
    cp_async_commit();

    const __nv_bfloat16* a = sA + (kt % STAGES) * BM * kBK;
    const __nv_bfloat16* b = sB + (kt % STAGES) * BN * kBK;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t af[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        // x4: lanes 0-15 address rows 0-15 at k 0-7, lanes 16-31 rows 0-15 at k 8-15 →
        // registers {rows 0-7 k0-7, rows 8-15 k0-7, rows 0-7 k8-15, rows 8-15 k8-15} = a0..a3.
        const int r = wm * 32 + mi * 16 + (lane & 15);
        ldmatrix_x4(af[mi], a + swz(r, kk * 2 + (lane >> 4)));
      }
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        // x2: lanes 0-7 address tokens 0-7 at k 0-7, lanes 8-15 at k 8-15 → b0, b1
        // (smem holds [token][k], i.e. B column-major). Lanes 16-31 repeat valid addresses.
        uint32_t bfr[2];
        const int n = wn * NI * 8 + ni * 8 + (lane & 7);
        ldmatrix_x2(bfr, b + swz(n, kk * 2 + ((lane >> 3) & 1)));
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) mma_bf16(acc[mi][ni], af[mi], bfr);
      }
    }
  }
  cp_async_wait<0>();

  // Epilogue. Accumulator q of a fragment: weight row g + 8·(q / 2), token 2·t4 + q % 2, with
  // g = lane / 4, t4 = lane % 4. Lanes g and g^1 (lane ^ 4) swap one value so that each writes
  // two adjacent output columns (channels) of one token as a bf16x2.
  const int g = lane >> 2, t4 = lane & 3;
  const bool odd = g & 1;
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(p.output);
  constexpr int kFrags = kGemm1 ? 1 : 2;
#pragma unroll
  for (int mi = 0; mi < kFrags; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float v0, v1;  // (row g + 8h, token 2·t4) and (row g + 8h, token 2·t4 + 1)
        if constexpr (kGemm1) {
          const float g0 = acc[0][ni][2 * h], g1 = acc[0][ni][2 * h + 1];
          const float u0 = acc[1][ni][2 * h], u1 = acc[1][ni][2 * h + 1];
          v0 = g0 / (1.0f + expf(-g0)) * u0;
          v1 = g1 / (1.0f + expf(-g1)) * u1;
        } else {
          v0 = acc[mi][ni][2 * h];
          v1 = acc[mi][ni][2 * h + 1];
        }
        const float recv = __shfl_xor_sync(kFull, odd ? v0 : v1, 4);
        const int row_in = (g & ~1) + 8 * h;  // even row of the pair
        const int token = wn * NI * 8 + ni * 8 + 2 * t4 + (odd ? 1 : 0);
        const float lo = odd ? recv : v0, hi = odd ? v1 : recv;
        int col;
        if constexpr (kGemm1) {
          col = blockIdx.x * (BM / 2) + wm * 16 + row_in;
        } else {
          col = blockIdx.x * BM + wm * 32 + mi * 16 + row_in;
        }
        *reinterpret_cast<__nv_bfloat162*>(out + size_t(row0 + token) * p.n_out + col) =
            __floats2bfloat162_rn(lo, hi);
      }
}

// One CTA per token; each thread sums 8 columns at a time over the token's k choices.
__global__ void __launch_bounds__(128) finalize_kernel(MoeFinalizeParams p) {
  const int t = blockIdx.x;
  const __nv_bfloat16* Y = reinterpret_cast<const __nv_bfloat16*>(p.y);
  const int chunks = p.hidden / 8;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < p.top_k; ++j) {
      const int row = p.expanded_to_permuted[size_t(t) * p.top_k + j];
      if (row < 0) continue;
      const float w = p.topk_weights[size_t(t) * p.top_k + j];
      const uint4 v = *reinterpret_cast<const uint4*>(Y + size_t(row) * p.hidden + c * 8);
      const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(h2[i]);
        acc[2 * i] += w * f.x;
        acc[2 * i + 1] += w * f.y;
      }
    }
    uint4 o;
    __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
    for (int i = 0; i < 4; ++i) o2[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
    *reinterpret_cast<uint4*>(reinterpret_cast<__nv_bfloat16*>(p.out) + size_t(t) * p.hidden +
                              c * 8) = o;
  }
}

void check_launch(const char* name) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw Error(std::string("CUDA launch of ") + name + " failed: " + cudaGetErrorString(e));
}

template <int WARPS_M, int WARPS_N, int NI, int STAGES>
void launch(const MoeGemmParams& p, cudaStream_t stream) {
  constexpr int BM = 32 * WARPS_M, BN = 8 * NI * WARPS_N;
  constexpr size_t kSmem = size_t(STAGES) * (BM + BN) * kBK * 2;
  auto kernel = p.gemm1 ? moe_gemm_kernel<WARPS_M, WARPS_N, NI, STAGES, true>
                        : moe_gemm_kernel<WARPS_M, WARPS_N, NI, STAGES, false>;
  // Once per instantiation (not a stream operation, so also safe before graph capture).
  static const bool configured = [] {
    cudaFuncSetAttribute(moe_gemm_kernel<WARPS_M, WARPS_N, NI, STAGES, true>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem));
    cudaFuncSetAttribute(moe_gemm_kernel<WARPS_M, WARPS_N, NI, STAGES, false>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem));
    return true;
  }();
  (void)configured;
  const int m_blocks = p.gemm1 ? p.n_out / (BM / 2) : p.n_out / BM;
  dim3 grid(m_blocks, p.max_tiles);
  kernel<<<grid, WARPS_M * WARPS_N * 32, kSmem, stream>>>(p);
  check_launch(p.gemm1 ? "moe_gemm1" : "moe_gemm2");
}

}  // namespace

void moe_grouped_gemm(const MoeGemmParams& p, cudaStream_t stream) {
  const int m_align = p.gemm1 ? 64 : 128;
  if (p.k % kBK != 0 || p.n_out % m_align != 0 || p.k <= 0 || p.n_out <= 0)
    throw InvalidArgument("moe_grouped_gemm: need k % 64 == 0 and " +
                          std::string(p.gemm1 ? "inter % 64" : "hidden % 128") + " == 0 (got k=" +
                          std::to_string(p.k) + ", n_out=" + std::to_string(p.n_out) + ")");
  if (p.max_tiles <= 0) return;
  if (p.config == MoeGemmConfig::kThroughput) {
    if (p.tile != 128) throw InvalidArgument("moe_grouped_gemm: throughput tile must be 128");
    launch<4, 2, 8, 3>(p, stream);
    return;
  }
  switch (p.tile) {
    case 8:
      launch<4, 1, 1, 4>(p, stream);
      break;
    case 16:
      launch<4, 1, 2, 4>(p, stream);
      break;
    case 32:
      launch<4, 1, 4, 4>(p, stream);
      break;
    case 64:
      launch<4, 1, 8, 4>(p, stream);
      break;
    default:
      throw InvalidArgument("moe_grouped_gemm: latency tile must be 8, 16, 32 or 64, got " +
                            std::to_string(p.tile));
  }
}

void moe_finalize(const MoeFinalizeParams& p, cudaStream_t stream) {
  if (p.hidden % 8 != 0) throw InvalidArgument("moe_finalize: hidden % 8 != 0");
  if (p.num_tokens <= 0) return;
  finalize_kernel<<<p.num_tokens, 128, 0, stream>>>(p);
  check_launch("moe_finalize");
}

}  // namespace serval::kernels::cuda
