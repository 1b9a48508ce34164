// qk-norm + RoPE + KV append: one warp per (token, head); lane l owns the rotary pairs
// (i, i + D/2) for i = l, l + 32, ... < D/2, so norm, rotation and stores stay in registers.
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/norm_rope/qk_norm_rope_kv.h"

namespace serval::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

template <int D>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    qk_norm_rope_kv_kernel(const __nv_bfloat16* __restrict__ qkv,
                           const __nv_bfloat16* __restrict__ q_norm,
                           const __nv_bfloat16* __restrict__ k_norm,
                           const int32_t* __restrict__ positions,
                           const float* __restrict__ inv_freq,
                           const int32_t* __restrict__ slot_mapping, __nv_bfloat16* q_out,
                           __nv_bfloat16* k_cache, __nv_bfloat16* v_cache, int num_tokens,
                           int num_q_heads, int num_kv_heads, float eps) {
  constexpr int kHalf = D / 2;
  constexpr int kPairs = (kHalf + 31) / 32;  // rotary pairs per lane
  const int heads_per_token = num_q_heads + 2 * num_kv_heads;
  const int64_t item = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (item >= int64_t(num_tokens) * heads_per_token) return;  // warp-uniform
  const int lane = threadIdx.x & 31;
  const int t = int(item / heads_per_token), h = int(item % heads_per_token);
  const __nv_bfloat16* src = qkv + item * D;  // row t, head h (heads are contiguous)

  const int kv_h = h - num_q_heads;  // k heads: [0, Hkv); v heads: [Hkv, 2·Hkv)
  const int32_t slot = slot_mapping[t];
  if (kv_h >= num_kv_heads) {  // v head: plain copy
    if (slot < 0) return;
    __nv_bfloat16* dst = v_cache + (int64_t(slot) * num_kv_heads + (kv_h - num_kv_heads)) * D;
    for (int i = lane; i < D; i += 32) dst[i] = src[i];
    return;
  }
  const bool is_q = kv_h < 0;
  if (!is_q && slot < 0) return;

  float x1[kPairs], x2[kPairs];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int i = lane + 32 * j;
    const bool ok = i < kHalf;
    x1[j] = ok ? __bfloat162float(src[i]) : 0.0f;
    x2[j] = ok ? __bfloat162float(src[i + kHalf]) : 0.0f;
  }
  const __nv_bfloat16* norm_w = is_q ? q_norm : k_norm;
  if (norm_w != nullptr) {
    float sum_sq = 0.0f;
#pragma unroll
    for (int j = 0; j < kPairs; ++j) sum_sq += x1[j] * x1[j] + x2[j] * x2[j];
    const float inv = rsqrtf(warp_sum(sum_sq) / float(D) + eps);
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const int i = lane + 32 * j;
      if (i < kHalf) {
        x1[j] *= inv * __bfloat162float(norm_w[i]);
        x2[j] *= inv * __bfloat162float(norm_w[i + kHalf]);
      }
    }
  }
  const float pos = float(positions[t]);
  __nv_bfloat16* dst = is_q ? q_out + (int64_t(t) * num_q_heads + h) * D
                            : k_cache + (int64_t(slot) * num_kv_heads + kv_h) * D;
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int i = lane + 32 * j;
    if (i < kHalf) {
      float s, c;
      sincosf(pos * inv_freq[i], &s, &c);
      dst[i] = __float2bfloat16(x1[j] * c - x2[j] * s);
      dst[i + kHalf] = __float2bfloat16(x2[j] * c + x1[j] * s);
    }
  }
}

}  // namespace

void qk_norm_rope_kv(const QkNormRopeKvParams& p, cudaStream_t stream) {
  if ((p.q_norm == nullptr) != (p.k_norm == nullptr)) {
    throw InvalidArgument("cuda qk_norm_rope_kv: q_norm and k_norm must be both set or both null");
  }
  const int64_t items = int64_t(p.num_tokens) * (p.num_q_heads + 2 * p.num_kv_heads);
  if (items == 0) return;
  const dim3 grid(unsigned((items + kWarpsPerBlock - 1) / kWarpsPerBlock));
  const auto* qkv = reinterpret_cast<const __nv_bfloat16*>(p.qkv);
  const auto* qn = reinterpret_cast<const __nv_bfloat16*>(p.q_norm);
  const auto* kn = reinterpret_cast<const __nv_bfloat16*>(p.k_norm);
  auto* q_out = reinterpret_cast<__nv_bfloat16*>(p.q_out);
  auto* kc = reinterpret_cast<__nv_bfloat16*>(p.k_cache);
  auto* vc = reinterpret_cast<__nv_bfloat16*>(p.v_cache);
  auto launch = [&](auto kernel) {
    kernel<<<grid, kWarpsPerBlock * 32, 0, stream>>>(qkv, qn, kn, p.positions, p.inv_freq,
                                                     p.slot_mapping, q_out, kc, vc, p.num_tokens,
                                                     p.num_q_heads, p.num_kv_heads, p.eps);
  };
  switch (p.head_dim) {
    case 16:
      launch(qk_norm_rope_kv_kernel<16>);
      break;
    case 32:
      launch(qk_norm_rope_kv_kernel<32>);
      break;
    case 64:
      launch(qk_norm_rope_kv_kernel<64>);
      break;
    case 128:
      launch(qk_norm_rope_kv_kernel<128>);
      break;
    default:
      throw InvalidArgument("cuda qk_norm_rope_kv: head_dim " + std::to_string(p.head_dim) +
                            " unsupported (16, 32, 64 or 128)");
  }
  check_launch("qk_norm_rope_kv");
}

}  // namespace serval::kernels::cuda
