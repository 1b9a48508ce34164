// The CPU backend: f32 activations, weights in their checkpoint dtype, fp32 KV cache.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "backend/moe/moe_cpu.h"
#include "base/error.h"
#include "kernels/cpu/nvfp4_quant.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant_linear.h"

namespace serval::backend {

namespace {

void expect_f32(const Tensor& t, const char* what) {
  if (t.dtype != DType::kF32)
    throw Error(std::string("cpu backend: ") + what + " must be float32, got " +
                std::string(dtype_name(t.dtype)));
}

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::kCpu; }
  std::string name() const override { return "cpu"; }
  DType activation_dtype() const override { return DType::kF32; }
  DType kv_cache_dtype() const override { return DType::kF32; }

  Tensor empty(DType dtype, Shape shape) override { return host_empty(dtype, std::move(shape)); }
  Tensor upload(const Tensor& host) override { return host; }
  Tensor upload_weight(const Tensor& host) override { return host; }
  QuantizedWeight upload_quantized(const QuantizedWeight& host) override { return host; }
  void memory_info(int64_t* free_bytes, int64_t* total_bytes) override {
    *free_bytes = *total_bytes = 0;  // unknown; the loader reads /proc/meminfo
  }
  void download(const Tensor& src, void* dst) override { std::memcpy(dst, src.data, src.nbytes()); }
  void zero(Tensor& t) override { std::memset(t.data, 0, t.nbytes()); }
  void copy_to_device(const void* src, Tensor& dst) override {
    std::memcpy(dst.data, src, dst.nbytes());
  }

  void embedding(const Tensor& table, const Tensor& ids, Tensor& out) override {
    kernels::cpu::embedding({table.data, table.dtype, ids.as<int32_t>(), out.as<float>(),
                             int(ids.numel()), int(table.dim(1)), int(table.dim(0))});
  }

  void rms_norm(const Tensor& x, Tensor* residual, const Tensor& w, float eps,
                Tensor& out) override {
    expect_f32(x, "rms_norm input");
    int hidden = int(w.numel());
    kernels::cpu::rms_norm({x.as<float>(), residual ? residual->as<float>() : nullptr, w.data,
                            w.dtype, out.as<float>(), int(x.numel() / hidden), hidden, eps});
  }

  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) override {
    expect_f32(x, "linear input");
    int k = int(w.dim(1)), n = int(w.dim(0));
    kernels::cpu::linear({x.as<float>(), w.data, w.dtype, bias ? bias->data : nullptr,
                          y.as<float>(), int(x.numel() / k), n, k});
  }

  void quantized_linear(const Tensor& x, const QuantizedWeight& w, const Tensor* bias,
                        Tensor& y) override {
    expect_f32(x, "linear input");
    check(w.experts == 0, "quantized_linear: a single linear, not an expert stack");
    kernels::QuantLinearParams p{};
    p.x = x.as<float>();
    std::vector<float> xq;
    if (w.quantize_activations) {
      xq.resize(size_t(x.numel()));
      kernels::cpu::nvfp4_fake_quant_rows(x.as<float>(), int(x.numel() / w.k), w.k,
                                          1.0f / w.input_scale.at(0), xq.data());
      p.x = xq.data();
    }
    p.format = w.format;
    p.w = w.data.as<const uint8_t>();
    p.scales = w.scales.data;
    p.global_scale = w.global_scale.at(0);
    p.block_n = w.block_n;
    p.block_k = w.block_k;
    p.bias = bias ? bias->data : nullptr;
    p.bias_dtype = bias ? bias->dtype : DType::kF32;
    p.y = y.as<float>();
    p.m = int(x.numel() / w.k);
    p.n = w.n;
    p.k = w.k;
    kernels::cpu::quant_linear(p);
  }

  void attention(const Tensor& qkv, const AttentionParams& a, KvCacheLayer& cache,
                 const StepMetadata& meta, Tensor& out) override {
    expect_f32(qkv, "attention input");
    const int T = meta.num_tokens, D = a.head_dim;
    const int q_dim = a.num_q_heads * D, kv_dim = a.num_kv_heads * D;
    Tensor q = host_empty(DType::kF32, {T, q_dim});
    Tensor k = host_empty(DType::kF32, {T, kv_dim});
    Tensor v = host_empty(DType::kF32, {T, kv_dim});
    for (int t = 0; t < T; ++t) {
      const float* row = qkv.as<float>() + size_t(t) * (q_dim + 2 * kv_dim);
      std::memcpy(q.as<float>() + size_t(t) * q_dim, row, sizeof(float) * q_dim);
      std::memcpy(k.as<float>() + size_t(t) * kv_dim, row + q_dim, sizeof(float) * kv_dim);
      std::memcpy(v.as<float>() + size_t(t) * kv_dim, row + q_dim + kv_dim, sizeof(float) * kv_dim);
    }
    if (a.q_norm) {
      kernels::cpu::rms_norm({q.as<float>(), nullptr, a.q_norm->data, a.q_norm->dtype,
                              q.as<float>(), T * a.num_q_heads, D, a.rms_norm_eps});
      kernels::cpu::rms_norm({k.as<float>(), nullptr, a.k_norm->data, a.k_norm->dtype,
                              k.as<float>(), T * a.num_kv_heads, D, a.rms_norm_eps});
    }
    kernels::cpu::rope({q.as<float>(), k.as<float>(), meta.positions.as<int32_t>(),
                        a.inv_freq->as<float>(), T, a.num_q_heads, a.num_kv_heads, D});
    kernels::cpu::kv_append({k.as<float>(), v.as<float>(), meta.slot_mapping.as<int32_t>(),
                             cache.k.data, cache.v.data, T, a.num_kv_heads, D, cache.k.dtype,
                             cache.k_scale, cache.v_scale});
    kernels::PagedAttentionParams p{};
    p.q = q.as<float>();
    p.out = out.as<float>();
    p.k_cache = cache.k.data;
    p.v_cache = cache.v.data;
    p.cache_dtype = cache.k.dtype;
    p.v_scale = cache.v_scale;
    p.query_start = meta.query_start.as<int32_t>();
    p.context_lens = meta.context_lens.as<int32_t>();
    p.block_tables = meta.block_tables.as<int32_t>();
    p.num_seqs = meta.num_seqs;
    p.max_blocks_per_seq = meta.max_blocks_per_seq;
    p.block_size = cache.block_size;
    p.num_q_heads = a.num_q_heads;
    p.num_kv_heads = a.num_kv_heads;
    p.head_dim = D;
    p.scale = a.scale * cache.k_scale;  // k = k8 · k_scale, folded into the softmax scale
    kernels::cpu::paged_attention(p);
  }

  void mla_attention(const Tensor& q, const Tensor& q_lat, const Tensor& kv, const MlaParams& a,
                     KvCacheLayer& cache, const StepMetadata& meta, Tensor& out) override {
    expect_f32(q, "mla_attention q");
    const int T = int(q.dim(0));
    if (T == 0) return;
    Tensor q_pe = host_empty(DType::kF32, {T, a.num_heads, a.rope_dim});
    kernels::MlaPrepareParams prep{};
    prep.kv = kv.as<float>();
    prep.kv_norm = a.kv_norm->data;
    prep.kv_norm_dtype = a.kv_norm->dtype;
    prep.q = q.as<float>();
    prep.q_pe = q_pe.as<float>();
    prep.positions = meta.positions.as<int32_t>();
    prep.slot_mapping = meta.slot_mapping.as<int32_t>();
    prep.inv_freq = a.inv_freq->as<float>();
    prep.cache = cache.k.data;
    prep.cache_dtype = cache.k.dtype;
    prep.k_scale = cache.k_scale;
    prep.num_tokens = T;
    prep.num_heads = a.num_heads;
    prep.latent_dim = a.latent_dim;
    prep.rope_dim = a.rope_dim;
    prep.q_stride = a.q_stride;
    prep.q_rope_offset = a.q_rope_offset;
    prep.eps = a.rms_norm_eps;
    prep.rope_scale = a.rope_scale;
    prep.rope_interleaved = a.rope_interleaved;
    kernels::cpu::mla_prepare(prep);
    kernels::MlaAttentionParams p{};
    p.q_lat = q_lat.as<float>();
    p.q_pe = q_pe.as<float>();
    p.cache = cache.k.data;
    p.cache_dtype = cache.k.dtype;
    p.out = out.as<float>();
    p.query_start = meta.query_start.as<int32_t>();
    p.context_lens = meta.context_lens.as<int32_t>();
    p.block_tables = meta.block_tables.as<int32_t>();
    p.num_seqs = meta.num_seqs;
    p.max_blocks_per_seq = meta.max_blocks_per_seq;
    p.block_size = cache.block_size;
    p.num_heads = a.num_heads;
    p.latent_dim = a.latent_dim;
    p.rope_dim = a.rope_dim;
    p.scale = a.scale * cache.k_scale;
    p.v_scale = cache.k_scale;
    kernels::cpu::mla_attention(p);
  }

  void head_linear(const Tensor& x, int x_stride, const Tensor& w, Tensor& y) override {
    expect_f32(x, "head_linear input");
    const int T = int(x.dim(0)), H = int(w.dim(0)), n = int(w.dim(1)), k = int(w.dim(2));
    check(
        x_stride >= k && x.numel() == int64_t(T) * H * x_stride && y.numel() == int64_t(T) * H * n,
        "head_linear: x [T, H·x_stride] with x_stride >= k, y [T, H·n]");
    const size_t head_bytes = size_t(n) * k * dtype_bits(w.dtype) / 8;
    std::vector<float> xs(size_t(T) * k), ys(size_t(T) * n);
    for (int h = 0; h < H; ++h) {
      for (int t = 0; t < T; ++t)
        std::memcpy(&xs[size_t(t) * k], x.as<float>() + (size_t(t) * H + h) * x_stride,
                    sizeof(float) * k);
      kernels::cpu::linear({xs.data(), static_cast<const char*>(w.data) + h * head_bytes, w.dtype,
                            nullptr, ys.data(), T, n, k});
      for (int t = 0; t < T; ++t)
        std::memcpy(y.as<float>() + (size_t(t) * H + h) * n, &ys[size_t(t) * n], sizeof(float) * n);
    }
  }

  void add(const Tensor& x, Tensor& out) override {
    expect_f32(x, "add input");
    check(x.numel() == out.numel(), "add: equal shapes");
    for (int64_t i = 0; i < x.numel(); ++i) out.as<float>()[i] += x.as<float>()[i];
  }

  void silu_mul(const Tensor& x, Tensor& out) override {
    int inter = int(out.dim(-1));
    kernels::cpu::silu_mul({x.as<float>(), out.as<float>(), int(out.numel() / inter), inter});
  }

  void to_float(const Tensor& x, Tensor& out) override {
    expect_f32(x, "to_float input");
    std::memcpy(out.data, x.data, size_t(x.numel()) * sizeof(float));
  }

  void sigmoid_gate_add(const Tensor& gate, const Tensor& x, Tensor& out) override {
    const int cols = int(out.dim(-1));
    kernels::cpu::sigmoid_gate_add(
        {gate.as<float>(), x.as<float>(), out.as<float>(), int(out.numel() / cols), cols});
  }

  void prepare_moe(MoeWeights&) override {}

  void moe(const Tensor& x, const MoeWeights& w, Tensor& out) override {
    expect_f32(x, "moe input");
    moe::moe_forward_cpu(x.as<float>(), int(x.dim(0)), w, out.as<float>());
  }

  void argmax(const Tensor& logits, Tensor& out) override {
    const int64_t rows = logits.dim(0), vocab = logits.dim(1);
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = logits.as<float>() + r * vocab;
      out.as<int32_t>()[r] = int32_t(std::max_element(row, row + vocab) - row);
    }
  }

  void resolve_pending_tokens(Tensor& ids, const Tensor& sampled) override {
    int32_t* v = ids.as<int32_t>();
    for (int64_t i = 0; i < ids.numel(); ++i)
      if (v[i] < 0) v[i] = sampled.as<int32_t>()[-(int64_t(v[i]) + 1)];
  }

  void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) override {
    size_t row_bytes = x.nbytes() / size_t(x.dim(0));
    for (int64_t i = 0; i < rows.numel(); ++i) {
      std::memcpy(static_cast<char*>(out.data) + i * row_bytes,
                  static_cast<const char*>(x.data) + size_t(rows.as<int32_t>()[i]) * row_bytes,
                  row_bytes);
    }
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() {
  return std::make_unique<CpuBackend>();
}

#ifndef SERVAL_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend() {
  return nullptr;
}
bool cuda_available() {
  return false;
}
#endif

}  // namespace serval::backend
