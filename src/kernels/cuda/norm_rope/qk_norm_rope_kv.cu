// qk-norm + RoPE + KV append: one warp per (token, head); lane l owns the rotary pairs
// (i, i + D/2) for i = l, l + 32, ... < D/2, so norm, rotation and stores stay in registers.
// V heads use the same pairing (no norm, no rotation) so both caches are written by one helper.
//
// Latency (decode: a few dozen warps) is one chain of dependent loads, kept to a single round
// trip: the weights (norm weights, inv_freq: constant during a step) are read before pdl_wait,
// and the slot, position and head values are all in flight together after it.
#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/norm_rope/qk_norm_rope_kv.h"
#include "kernels/cuda/norm_rope/rope_lane.cuh"

namespace serval::kernels::cuda {
namespace {

// Warps per CTA: 4, or 1 when there are few items (decode), to spread them over more SMs.
constexpr int kWarpsPerBlock = 4;
constexpr int kSmallGridItems = 1024;

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
  using L = rope::Lanes<D>;
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
  float w1[L::kPairs], w2[L::kPairs], freq[L::kPairs];
  rope::load_norm_weights<D>(norm_w, lane, in_range && !is_v, w1, w2);
  rope::load_inv_freq<D>(inv_freq, lane, in_range && !is_v, freq);
  pdl_wait();
  pdl_launch_dependents();
  if (!in_range) return;

  // Metadata and the head's values in flight together.
  const int32_t slot = slot_mapping[t];
  const float pos = float(positions[t]);
  float x1[L::kPairs], x2[L::kPairs];
  rope::load_head<D>(qkv + item * D, lane, x1, x2);  // row t, head h (heads are contiguous)
  if (!is_q && slot < 0) return;

  uint32_t pairs[L::kPairs];
  if (is_v) {  // cast(v · (1/v_scale))
    rope::encode_head<D, C>(x1, x2, inv_v_scale, pairs);
    rope::store_head<D, C>(
        static_cast<unsigned char*>(v_cache) +
            (int64_t(slot) * num_kv_heads + kv_h - num_kv_heads) * D * kElemBytes,
        lane, pairs);
    return;
  }
  if (norm_w != nullptr) rope::rms_norm_head<D>(x1, x2, w1, w2, eps);
  float cos_a[L::kPairs], sin_a[L::kPairs];
  rope::angles<D>(pos, freq, cos_a, sin_a);
  rope::rotate<D>(x1, x2, cos_a, sin_a);
  if (is_q) {
#pragma unroll
    for (int j = 0; j < L::kPairs; ++j) pairs[j] = rope::encode_pair<DType::kBF16>(x1[j], x2[j]);
    rope::store_head<D, DType::kBF16>(q_out + (int64_t(t) * num_q_heads + h) * D, lane, pairs);
  } else {
    rope::encode_head<D, C>(x1, x2, inv_k_scale, pairs);
    rope::store_head<D, C>(static_cast<unsigned char*>(k_cache) +
                               (int64_t(slot) * num_kv_heads + kv_h) * D * kElemBytes,
                           lane, pairs);
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

void check_qk_norm_rope_kv(const QkNormRopeKvParams& p) {
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
  if (items > int64_t(INT32_MAX) - kWarpsPerBlock)
    throw InvalidArgument("cuda qk_norm_rope_kv: " + std::to_string(items) +
                          " (token, head) items exceed the 32-bit index range");
  if (p.head_dim != 16 && p.head_dim != 32 && p.head_dim != 64 && p.head_dim != 128)
    throw InvalidArgument("cuda qk_norm_rope_kv: head_dim " + std::to_string(p.head_dim) +
                          " unsupported (16, 32, 64 or 128)");
}

void qk_norm_rope_kv(const QkNormRopeKvParams& p, cudaStream_t stream) {
  check_qk_norm_rope_kv(p);
  const int64_t items = int64_t(p.num_tokens) * (p.num_q_heads + 2 * p.num_kv_heads);
  if (items == 0) return;
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
    default:  // 128 (checked)
      launch<128>(p, items, stream);
      break;
  }
}

}  // namespace serval::kernels::cuda
