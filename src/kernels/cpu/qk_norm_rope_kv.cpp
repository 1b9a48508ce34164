// Fused attention pre-processing on the CPU: split QKV, per-head RMSNorm, RoPE, KV append.
#include "kernels/cpu/qk_norm_rope_kv.h"

#include <cstring>
#include <vector>

#include "kernels/cpu/ops.h"

namespace serval::kernels::cpu {

void qk_norm_rope_kv(const QkNormRopeKvParams& p) {
  const int T = p.num_tokens, D = p.head_dim, Hq = p.num_q_heads, Hkv = p.num_kv_heads;
  const size_t row = size_t(Hq + 2 * Hkv) * D;
  std::vector<float> k(size_t(T) * Hkv * D), v(size_t(T) * Hkv * D);
  for (int t = 0; t < T; ++t) {
    const float* src = p.qkv + t * row;
    std::memcpy(p.q_out + size_t(t) * Hq * D, src, size_t(Hq) * D * 4);
    std::memcpy(k.data() + size_t(t) * Hkv * D, src + size_t(Hq) * D, size_t(Hkv) * D * 4);
    std::memcpy(v.data() + size_t(t) * Hkv * D, src + size_t(Hq + Hkv) * D, size_t(Hkv) * D * 4);
  }
  if (p.q_norm != nullptr) {  // per-head norm: rows of head_dim
    rms_norm({p.q_out, nullptr, p.q_norm, DType::kF32, p.q_out, T * Hq, D, p.eps});
    rms_norm({k.data(), nullptr, p.k_norm, DType::kF32, k.data(), T * Hkv, D, p.eps});
  }
  rope({p.q_out, k.data(), p.positions, p.inv_freq, T, Hq, Hkv, D});
  kv_append({k.data(), v.data(), p.slot_mapping, p.k_cache, p.v_cache, T, Hkv, D});
}

}  // namespace serval::kernels::cpu
