// The throughput backend's grouped GEMMs for NVFP4 experts on Hopper wgmma: warp-specialized and
// persistent like moe_gemm_wgmma_ws.cu, with the weights dequantized in registers.
//
// A CTA tile is 128 weight rows × 128 permuted token rows. Warpgroup 0 produces: it copies each
// stage's codes and block scales of the 8 repacked 16-row weight tiles (moe_nvfp4_repack.h: one
// 16-byte word of codes per lane per 16 × 64 tile, already in MMA A-fragment order) and the token
// rows (SW128 bf16) with cp.async, announcing the stage on its `full` mbarrier. Warpgroups 1 and 2
// consume 64 weight rows each: per stage a lane reads its code word(s) and scale bytes, decodes
// them to the bf16 A fragments of 4 k16 steps (nvfp4_fragment.cuh: e2m1 · scale · 2⁻⁶², exact)
// and issues 4 m64n128k16 wgmma with A from registers and B from shared memory; it decodes the
// next stage into a second register set while they run.
// The epilogue multiplies by global scale · 2⁶² (the grouped mma.sync kernel's rounding points:
// fp32 accumulation of exact bf16 products, one bf16 rounding of the output).
//
// GEMM1 pairs gate and up in registers: warp w of consumer c covers channels ch0 = 32c + 8w ..
// + 7 of the CTA; its A rows g are their gate rows and rows g + 8 their up rows, taken from the
// halves (h = w & 1) of the repacked gate and up tiles that hold them, so a thread's accumulator
// rows g and g + 8 are gate and up of one channel (moe_wgmma::store_tile's GEMM1 layout).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "kernels/cuda/misc/cp_async.cuh"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/mbarrier.cuh"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/misc/smem_opt_in.h"
#include "kernels/cuda/misc/wgmma.cuh"
#include "kernels/cuda/moe/moe_gemm_tile.cuh"
#include "kernels/cuda/moe/moe_gemm_wgmma.h"
#include "kernels/cuda/moe/moe_gemm_wgmma_tile.cuh"
#include "kernels/cuda/moe/nvfp4_fragment.cuh"

namespace serval::kernels::cuda {

namespace {

using moe_wgmma::kBK;
using moe_wgmma::kBN;
constexpr int kBM = 128;          // weight rows per CTA tile
constexpr int kTiles = kBM / 16;  // repacked 16-row weight tiles per stage
constexpr int kStages = 6;
constexpr int kThreads = 384;  // producer warpgroup 0, consumer warpgroups 1 and 2
// Stage: token rows (SW128, 1024-aligned) first, then the codes (512 bytes per weight tile) and
// the scales (64 bytes per tile); padded to keep every stage 1024-aligned.
constexpr uint32_t kBBytes = kBN * kBK * 2, kCodeBytes = kTiles * 512, kScaleBytes = kTiles * 64;
constexpr uint32_t kStageBytes = (kBBytes + kCodeBytes + kScaleBytes + 1023) / 1024 * 1024;
constexpr uint32_t kLutBytes = 256 * 4;
constexpr size_t kSmemBytes = size_t(kStages) * kStageBytes + kLutBytes + 2 * kStages * 8 + 1024;
constexpr int kProducerRegs = 64, kConsumerRegs = 216;
static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= wgmma::cta_register_allocation(kThreads),
              "the register hand-over must fit the CTA's allocation");

// Repacked tile index (row tile of the expert's weight, 16 rows each) of stage tile i (0..7) of
// weight block m_block. GEMM1: tiles 0-3 are the gate rows of the block's 64 channels, 4-7 their
// up rows; GEMM2: 8 consecutive row tiles.
template <bool kGemm1>
__device__ __forceinline__ int source_tile(const MoeGemmParams& p, int m_block, int i) {
  if constexpr (kGemm1) {
    const int gate = m_block * (kBM / 2) / 16 + (i & 3);
    return i < 4 ? gate : p.n_out / 16 + gate;
  } else {
    return m_block * kTiles + i;
  }
}

// Work items and PDL as moe_gemm_wgmma_ws.cu.
template <bool kGemm1>
__global__ void __launch_bounds__(kThreads, 1)
    moe_gemm_nvfp4_kernel(MoeGemmParams p, int m_blocks, bool narrow) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t pad = (1024 - (raw & 1023)) & 1023;
  const uint32_t smem = raw + pad;  // swizzle atoms: 1024-aligned
  uint32_t* lut = reinterpret_cast<uint32_t*>(smem_raw + pad + kStages * kStageBytes);
  auto stage = [&](int s) { return smem + uint32_t(s) * kStageBytes; };
  const moe_wgmma::StageRing<kStages> ring{smem + kStages * kStageBytes + kLutBytes};
  const int tid = threadIdx.x, wg = tid / 128;

  build_nvfp4_scale_table(lut);  // depends on nothing: before the PDL wait
  const int items = moe_persistent_items<kGemm1>(p, m_blocks);
  auto expert_of = [&](int tile) { return moe_persistent_expert<kGemm1>(p, tile); };
  if (tid == 0) ring.init();
  __syncthreads();  // barriers and the scale table
  const int K = p.k, KT = K / kBK;
  const size_t m_rows = kGemm1 ? 2 * size_t(p.n_out) : size_t(p.n_out);

  if (wg == 0) {
    wgmma::release_registers<kProducerRegs>();
    if constexpr (!kGemm1) {
      pdl_wait();  // GEMM1's act is complete from here on
      pdl_launch_dependents();
    }
    // Token rows: thread t copies chunk column t % 8 of rows t / 8 + 16j. Codes: chunks t and
    // t + 128 (lane c % 32 of stage tile c / 32); scales: threads 0-31, chunk t (tile t / 4).
    const int kc = tid & 7, r0 = tid / 8;
    int it = 0;  // stage uses so far
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
      const int mb = item % m_blocks, row0 = (item / m_blocks) * kBN;
      const int expert = expert_of(item / m_blocks);
      const uint8_t* codes =
          static_cast<const uint8_t*>(p.weights) + size_t(expert) * m_rows * (K / 2);
      const uint8_t* scales = p.weight_scales + size_t(expert) * m_rows * (K / 16);
      const uint8_t* c_src[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int c = tid + 128 * j;
        c_src[j] = codes + size_t(source_tile<kGemm1>(p, mb, c / 32)) * KT * 512 + (c % 32) * 16;
      }
      const uint8_t* s_src =
          scales + size_t(source_tile<kGemm1>(p, mb, (tid & 31) / 4)) * KT * 64 + (tid % 4) * 16;
      const __nv_bfloat16* b_src[kBN / 16];
      const uint32_t b_valid = moe_wgmma::token_sources<kGemm1>(p, row0, r0, kc, narrow, b_src);
      for (int kt = 0; kt < KT; ++kt, ++it) {
        const int s = ring.wait_empty(it);
        const uint32_t b = stage(s), a = b + kBBytes;
#pragma unroll
        for (int j = 0; j < kBN / 16; ++j)
          cp_async_16(b + wgmma::sw128_offset(r0 + 16 * j, kc, kBN), b_src[j] + kt * kBK,
                      (b_valid >> j) & 1);
#pragma unroll
        for (int j = 0; j < 2; ++j)
          cp_async_16(a + (tid + 128 * j) * 16, c_src[j] + size_t(kt) * 512, true);
        if (tid < 32) cp_async_16(a + kCodeBytes + tid * 16, s_src + size_t(kt) * 64, true);
        mbarrier::arrive_on_cp_async(ring.full(s));
      }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");  // leave nothing in flight
    return;
  }

  wgmma::claim_registers<kConsumerRegs>();
  if constexpr (!kGemm1) pdl_wait();  // before writing y (pdl.cuh contract)
  const int c = wg - 1, lane = tid & 31, wq = (tid / 32) & 3, g = lane >> 2;
  const bool releaser = (tid & 127) == 0;  // arrives on `empty` for its warpgroup
  // This warp's stage tiles: GEMM1 its channels' gate tile (half h) and up tile; GEMM2 one tile.
  const int tile_a = kGemm1 ? 2 * c + wq / 2 : 4 * c + wq, tile_b = tile_a + 4, h = wq & 1;
  // A fragments of one stage's 4 k16 steps into `a` (bf16x2 registers, the m16n8k16 A layout).
  auto decode = [&](uint32_t a_stage, uint32_t(&a)[4][4]) {
    const uint8_t* base = smem_raw + (a_stage - raw);
    const uint4 w0 = *reinterpret_cast<const uint4*>(base + tile_a * 512 + lane * 16);
    const uint2 s0 = *reinterpret_cast<const uint2*>(base + kCodeBytes + tile_a * 64 + g * 8);
    uint4 w1 = w0;
    uint2 s1 = s0;
    if constexpr (kGemm1) {
      w1 = *reinterpret_cast<const uint4*>(base + tile_b * 512 + lane * 16);
      s1 = *reinterpret_cast<const uint2*>(base + kCodeBytes + tile_b * 64 + g * 8);
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t c0 = kk == 0 ? w0.x : kk == 1 ? w0.y : kk == 2 ? w0.z : w0.w;
      // Scale bytes 2·kk (row g) and 2·kk + 1 (row g + 8) of the lane's 8.
      const uint32_t sb0 = ((kk < 2 ? s0.x : s0.y) >> (16 * (kk & 1))) & 0xffffu;
      if constexpr (kGemm1) {
        const uint32_t c1 = kk == 0 ? w1.x : kk == 1 ? w1.y : kk == 2 ? w1.z : w1.w;
        const uint32_t sb1 = ((kk < 2 ? s1.x : s1.y) >> (16 * (kk & 1))) & 0xffffu;
        const uint32_t sg = lut[(sb0 >> (8 * h)) & 0xffu], su = lut[(sb1 >> (8 * h)) & 0xffu];
        a[kk][0] = bf16x2_mul(nvfp4_bf16x2_bits(c0, h), sg);      // gate, columns 2t..
        a[kk][1] = bf16x2_mul(nvfp4_bf16x2_bits(c1, h), su);      // up, columns 2t..
        a[kk][2] = bf16x2_mul(nvfp4_bf16x2_bits(c0, 2 + h), sg);  // gate, columns 2t + 8..
        a[kk][3] = bf16x2_mul(nvfp4_bf16x2_bits(c1, 2 + h), su);  // up, columns 2t + 8..
      } else {
        dequant_nvfp4(a[kk], c0, lut[sb0 & 0xffu], lut[sb0 >> 8]);
      }
    }
  };
  int it = 0;
  // One item at token width kN (moe_wgmma::tile_width; a straight run of wgmma per width).
  auto run_item = [&](auto width, int item) {
    constexpr int kN = decltype(width)::value;
    float acc[1][kBN / 8][4];
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j)
      acc[0][j][0] = acc[0][j][1] = acc[0][j][2] = acc[0][j][3] = 0.0f;
    auto issue = [&](int s, const uint32_t(&a)[4][4]) {
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint64_t b = wgmma::sw128_desc(stage(s) + kk * 32, 16, 1024);
        if constexpr (kN == 32) {
          wgmma::wgmma_m64n32k16_rs(reinterpret_cast<float(&)[4][4]>(acc[0]), a[kk], b);
        } else if constexpr (kN == 64) {
          wgmma::wgmma_m64n64k16_rs(reinterpret_cast<float(&)[8][4]>(acc[0]), a[kk], b);
        } else {
          wgmma::wgmma_m64n128k16_rs<0>(acc[0], a[kk], b, 1);
        }
      }
      wgmma::commit();
    };
    // Stage kt + 1 is decoded into the other register set while stage kt's wgmma run (waiting
    // for each stage's wgmma before decoding the next into the same registers was 1.5 % slower:
    // the MoE layer of Qwen3-30B NVFP4 at 8192 tokens 1786-1795 vs 1756-1769 us on the H200).
    uint32_t a0[4][4], a1[4][4];
    int s = ring.wait_full(it);
    wgmma::fence_proxy_async();  // the producer's cp.async writes, seen through the async proxy
    decode(stage(s) + kBBytes, a0);
    auto step = [&](uint32_t(&cur)[4][4], uint32_t(&next)[4][4], int kt) {
      issue(s, cur);
      int s_next = 0;
      if (kt + 1 < KT) {
        s_next = ring.wait_full(it + 1);
        wgmma::fence_proxy_async();
        decode(stage(s_next) + kBBytes, next);
      }
      wgmma::wait<0>();
      wgmma::fence_operand(cur);  // cur is rewritten (two stages on) only after its wgmma
      if (releaser) mbarrier::arrive(ring.empty(s));
      ++it;
      s = s_next;
    };
    for (int kt = 0; kt < KT; kt += 2) {  // two steps per pass: register sets by name
      step(a0, a1, kt);
      if (kt + 1 < KT) step(a1, a0, kt + 1);
    }
    wgmma::fence_operand(acc[0]);
    const float unscale = p.global_scales[expert_of(item / m_blocks)] * kNvfp4Unscale;
#pragma unroll
    for (int j = 0; j < kN / 8; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[0][j][q] *= unscale;
    moe_wgmma::store_tile<kGemm1, kBM, 1, kN>(p, acc, item % m_blocks, (item / m_blocks) * kBN, c,
                                              wq, lane);
  };
  for (int item = blockIdx.x; item < items; item += gridDim.x)
    moe_wgmma::with_tile_width(p, (item / m_blocks) * kBN, narrow,
                               [&](auto width) { run_item(width, item); });
}

}  // namespace

bool moe_grouped_gemm_wgmma_nvfp4(const MoeGemmParams& p, cudaStream_t stream) {
  static const bool off = [] {
    const char* env = std::getenv("SERVAL_MOE_NVFP4_WGMMA");
    return env != nullptr && std::string(env) == "0";
  }();
  if (off || p.format != MoeWeightFormat::kNvfp4 || p.n_out % (p.gemm1 ? kBM / 2 : kBM) != 0)
    return false;
  auto kernel = p.gemm1 ? moe_gemm_nvfp4_kernel<true> : moe_gemm_nvfp4_kernel<false>;
  allow_dynamic_smem(kernel, kSmemBytes, "moe_gemm_wgmma_nvfp4");
  const int m_blocks = p.gemm1 ? p.n_out / (kBM / 2) : p.n_out / kBM;
  const int64_t all = int64_t(m_blocks) * p.max_tiles;
  const int ctas = int(std::min<int64_t>(all, sm_count()));
  launch_pdl(p.gemm1 ? "moe_gemm1_wgmma_nvfp4" : "moe_gemm2_wgmma_nvfp4", kernel, dim3(ctas),
             dim3(kThreads), kSmemBytes, stream, p, m_blocks, moe_narrow_tiles(p));
  return true;
}

}  // namespace serval::kernels::cuda
