// qk-norm + RoPE + KV append: one warp per (token, head); lane l owns the rotary pairs
// (i, i + D/2) for i = l, l + 32, ... < D/2, so norm, rotation and stores stay in registers.
// V heads use the same pairing (no norm, no rotation) so both caches are written by one helper.
//
// Latency (decode: a few dozen warps) is one chain of dependent loads, kept to a single round
// trip: the weights (norm weights, inv_freq: constant during a step) are read before pdl_wait,
// and the slot, position and head values are all in flight together after it.
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/norm_rope/qk_norm_rope_kv.h"

namespace serval::kernels::cuda {
namespace {

// Warps per CTA: 4, or 1 when there are few items (decode), to spread them over more SMs.
constexpr int kWarpsPerBlock = 4;
constexpr int kSmallGridItems = 1024;

// Stores a → row[i] and b → row[i + kHalf] in the cache type C (round to nearest even; fp8
// saturates to the largest finite value: cvt.rn.satfinite).
template <DType C, int kHalf>
__device__ __forceinline__ void store_pair(void* row, int i, float a, float b) {
  if constexpr (C == DType::kBF16) {
    auto* p = static_cast<__nv_bfloat16*>(row);
    p[i] = __float2bfloat16(a);
    p[i + kHalf] = __float2bfloat16(b);
  } else {
    constexpr __nv_fp8_interpretation_t kFormat = C == DType::kF8E4M3 ? __NV_E4M3 : __NV_E5M2;
    const __nv_fp8x2_storage_t two =
        __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kFormat);  // a: low byte
    auto* p = static_cast<uint8_t*>(row);
    p[i] = uint8_t(two & 0xFFu);
    p[i + kHalf] = uint8_t(two >> 8);
  }
}

template <int D, DType C>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    qk_norm_rope_kv_kernel(const __nv_bfloat16* __restrict__ qkv,
                           const __nv_bfloat16* __restrict__ q_norm,
                           const __nv_bfloat16* __restrict__ k_norm,
                           const int32_t* __restrict__ positions,
                           const float* __restrict__ inv_freq,
                           const int32_t* __restrict__ slot_mapping, __nv_bfloat16* q_out,
                           void* k_cache, void* v_cache, int num_tokens, int num_q_heads,
                           int num_kv_heads, float eps, float inv_k_scale, float inv_v_scale) {
  constexpr int kHalf = D / 2;
  constexpr int kPairs = (kHalf + 31) / 32;  // rotary pairs per lane
  constexpr int kElemBytes = C == DType::kBF16 ? 2 : 1;
  const int heads_per_token = num_q_heads + 2 * num_kv_heads;
  const int64_t item = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const bool in_range = item < int64_t(num_tokens) * heads_per_token;  // warp-uniform
  const int lane = threadIdx.x & 31;
  // 32-bit division (the host keeps items < 2^31).
  const int t = int(item) / heads_per_token, h = int(item) % heads_per_token;
  const int kv_h = h - num_q_heads;  // k heads: [0, Hkv); v heads: [Hkv, 2·Hkv)
  const bool is_q = kv_h < 0, is_v = kv_h >= num_kv_heads;

  // Weights before pdl_wait (constant during a step, never written by an earlier kernel).
  const __nv_bfloat16* norm_w = is_q ? q_norm : k_norm;
  float w1[kPairs], w2[kPairs], freq[kPairs];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int i = lane + 32 * j;
    const bool ok = in_range && !is_v && i < kHalf;
    w1[j] = ok && norm_w != nullptr ? __bfloat162float(norm_w[i]) : 0.0f;
    w2[j] = ok && norm_w != nullptr ? __bfloat162float(norm_w[i + kHalf]) : 0.0f;
    freq[j] = ok ? inv_freq[i] : 0.0f;
  }
  pdl_wait();
  pdl_launch_dependents();
  if (!in_range) return;

  // Metadata and the head's values in flight together.
  const int32_t slot = slot_mapping[t];
  const float pos = float(positions[t]);
  const __nv_bfloat16* src = qkv + item * D;  // row t, head h (heads are contiguous)
  float x1[kPairs], x2[kPairs];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int i = lane + 32 * j;
    const bool ok = i < kHalf;
    x1[j] = ok ? __bfloat162float(src[i]) : 0.0f;
    x2[j] = ok ? __bfloat162float(src[i + kHalf]) : 0.0f;
  }
  if (!is_q && slot < 0) return;

  if (is_v) {  // cast(v · (1/v_scale)); __fmul_rn: the same single rounding as the CPU
    const int v_h = kv_h - num_kv_heads;
    void* row = static_cast<unsigned char*>(v_cache) +
                (int64_t(slot) * num_kv_heads + v_h) * D * kElemBytes;
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const int i = lane + 32 * j;
      if (i < kHalf)
        store_pair<C, kHalf>(row, i, __fmul_rn(x1[j], inv_v_scale), __fmul_rn(x2[j], inv_v_scale));
    }
    return;
  }
  if (norm_w != nullptr) {
    float sum_sq = 0.0f;
#pragma unroll
    for (int j = 0; j < kPairs; ++j) sum_sq += x1[j] * x1[j] + x2[j] * x2[j];
    const float inv = rsqrtf(warp_sum(sum_sq) / float(D) + eps);
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const int i = lane + 32 * j;
      if (i < kHalf) {
        x1[j] *= inv * w1[j];
        x2[j] *= inv * w2[j];
      }
    }
  }
  __nv_bfloat16* q_row = q_out + (int64_t(t) * num_q_heads + h) * D;
  void* k_row = is_q ? nullptr
                     : static_cast<unsigned char*>(k_cache) +
                           (int64_t(slot) * num_kv_heads + kv_h) * D * kElemBytes;
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int i = lane + 32 * j;
    if (i < kHalf) {
      float s, c;
      sincosf(pos * freq[j], &s, &c);
      const float y1 = x1[j] * c - x2[j] * s, y2 = x2[j] * c + x1[j] * s;
      if (is_q) {
        q_row[i] = __float2bfloat16(y1);
        q_row[i + kHalf] = __float2bfloat16(y2);
      } else {
        store_pair<C, kHalf>(k_row, i, __fmul_rn(y1, inv_k_scale), __fmul_rn(y2, inv_k_scale));
      }
    }
  }
}

template <int D>
void launch(const QkNormRopeKvParams& p, int64_t items, cudaStream_t stream) {
  const int warps = items <= kSmallGridItems ? 1 : kWarpsPerBlock;
  const dim3 grid(unsigned((items + warps - 1) / warps));
  const auto* qkv = reinterpret_cast<const __nv_bfloat16*>(p.qkv);
  const auto* qn = reinterpret_cast<const __nv_bfloat16*>(p.q_norm);
  const auto* kn = reinterpret_cast<const __nv_bfloat16*>(p.k_norm);
  auto* q_out = reinterpret_cast<__nv_bfloat16*>(p.q_out);
  // The reciprocals in fp32 on the host: the CPU kv_append multiplies by the same values.
  const float inv_k = 1.0f / p.k_scale, inv_v = 1.0f / p.v_scale;
  auto run = [&](auto kernel) {
    launch_pdl("qk_norm_rope_kv", kernel, grid, dim3(warps * 32), 0, stream, qkv, qn, kn,
               p.positions, p.inv_freq, p.slot_mapping, q_out, p.k_cache, p.v_cache, p.num_tokens,
               p.num_q_heads, p.num_kv_heads, p.eps, inv_k, inv_v);
  };
  switch (p.cache_dtype) {
    case DType::kBF16:
      return run(qk_norm_rope_kv_kernel<D, DType::kBF16>);
    case DType::kF8E4M3:
      return run(qk_norm_rope_kv_kernel<D, DType::kF8E4M3>);
    case DType::kF8E5M2:
      return run(qk_norm_rope_kv_kernel<D, DType::kF8E5M2>);
    default:
      throw InvalidArgument("cuda qk_norm_rope_kv: KV cache dtype " +
                            std::string(dtype_name(p.cache_dtype)) +
                            " unsupported (bf16, fp8 e4m3 or fp8 e5m2)");
  }
}

}  // namespace

void qk_norm_rope_kv(const QkNormRopeKvParams& p, cudaStream_t stream) {
  if ((p.q_norm == nullptr) != (p.k_norm == nullptr)) {
    throw InvalidArgument("cuda qk_norm_rope_kv: q_norm and k_norm must be both set or both null");
  }
  if (!(p.k_scale > 0.0f) || !(p.v_scale > 0.0f) || !std::isfinite(p.k_scale) ||
      !std::isfinite(p.v_scale)) {
    throw InvalidArgument("cuda qk_norm_rope_kv: k_scale " + std::to_string(p.k_scale) +
                          " and v_scale " + std::to_string(p.v_scale) +
                          " must be positive and finite");
  }
  const int64_t items = int64_t(p.num_tokens) * (p.num_q_heads + 2 * p.num_kv_heads);
  if (items == 0) return;
  if (items > int64_t(INT32_MAX) - kWarpsPerBlock)
    throw InvalidArgument("cuda qk_norm_rope_kv: " + std::to_string(items) +
                          " (token, head) items exceed the 32-bit index range");
  switch (p.head_dim) {
    case 16:
      launch<16>(p, items, stream);
      break;
    case 32:
      launch<32>(p, items, stream);
      break;
    case 64:
      launch<64>(p, items, stream);
      break;
    case 128:
      launch<128>(p, items, stream);
      break;
    default:
      throw InvalidArgument("cuda qk_norm_rope_kv: head_dim " + std::to_string(p.head_dim) +
                            " unsupported (16, 32, 64 or 128)");
  }
}

}  // namespace serval::kernels::cuda
