// Dummy weights generated "on the device" (Backend::dummy_dense / dummy_quantized) against the
// host path (WeightSource::get / read_linear, then upload): a CPU backend wrapper that claims
// device generation (its dummy_* are the base host fallbacks, which upload through the same
// upload_weight / upload_quantized) records every upload of both loads of the tiny Qwen3-MoE
// fixture. Dense tensors must be byte-identical (same counters), quantized weights of the same
// format, shapes, dtypes and scales, with dequantized values of std 0.02. Covers tensor-parallel
// slicing (rank 1 of 2) and expert-parallel selection.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "io/model_config.h"
#include "kernels/cpu/quant_linear.h"
#include "model/model.h"
#include "model/weight_source.h"

namespace serval {
namespace {

using Method = quant::QuantConfig::Method;

const std::string kFixture = std::string(SERVAL_SOURCE_DIR) + "/tests/fixtures/qwen3_moe";

// Forwards to the CPU backend; records uploads; generates_dummy_weights() as configured.
class RecordingBackend final : public backend::Backend {
 public:
  explicit RecordingBackend(bool generates)
      : inner_(backend::make_cpu_backend()), generates_(generates) {}

  std::vector<Tensor> dense;
  std::vector<backend::QuantizedWeight> quantized;

  bool generates_dummy_weights() const override { return generates_; }
  Tensor upload_weight(const Tensor& host) override {
    Tensor t = inner_->upload_weight(host);
    // Keep a private copy: the loader may reuse its host buffers.
    Tensor copy = host_empty(t.dtype, t.shape);
    std::memcpy(copy.data, t.data, t.nbytes());
    dense.push_back(copy);
    return t;
  }
  backend::QuantizedWeight upload_quantized(const backend::QuantizedWeight& host) override {
    backend::QuantizedWeight q = inner_->upload_quantized(host);
    quantized.push_back(q);
    return q;
  }

  Device device() const override { return inner_->device(); }
  std::string name() const override { return inner_->name(); }
  DType activation_dtype() const override { return inner_->activation_dtype(); }
  DType kv_cache_dtype() const override { return inner_->kv_cache_dtype(); }
  Tensor empty(DType dtype, Shape shape) override { return inner_->empty(dtype, shape); }
  Tensor upload(const Tensor& host) override { return inner_->upload(host); }
  void memory_info(int64_t* free_bytes, int64_t* total_bytes) override {
    inner_->memory_info(free_bytes, total_bytes);
  }
  void download(const Tensor& src, void* dst) override { inner_->download(src, dst); }
  void zero(Tensor& t) override { inner_->zero(t); }
  void copy_to_device(const void* src, Tensor& dst) override { inner_->copy_to_device(src, dst); }
  void embedding(const Tensor& table, const Tensor& ids, Tensor& out) override {
    inner_->embedding(table, ids, out);
  }
  void resolve_pending_tokens(Tensor& ids, const Tensor& sampled) override {
    inner_->resolve_pending_tokens(ids, sampled);
  }
  void rms_norm(const Tensor& x, Tensor* residual, const Tensor& w, float eps,
                Tensor& out) override {
    inner_->rms_norm(x, residual, w, eps, out);
  }
  using Backend::linear;
  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) override {
    inner_->linear(x, w, bias, y);
  }
  void quantized_linear(const Tensor& x, const backend::QuantizedWeight& w, const Tensor* bias,
                        Tensor& y) override {
    inner_->quantized_linear(x, w, bias, y);
  }
  void attention(const Tensor& qkv, const backend::AttentionParams& p, backend::KvCacheLayer& cache,
                 const backend::StepMetadata& meta, Tensor& out) override {
    inner_->attention(qkv, p, cache, meta, out);
  }
  void mla_attention(const Tensor& q, const Tensor& q_lat, const Tensor& kv,
                     const backend::MlaParams& p, backend::KvCacheLayer& cache,
                     const backend::StepMetadata& meta, Tensor& out) override {
    inner_->mla_attention(q, q_lat, kv, p, cache, meta, out);
  }
  void head_linear(const Tensor& x, int x_stride, const Tensor& w, Tensor& y) override {
    inner_->head_linear(x, x_stride, w, y);
  }
  void add(const Tensor& x, Tensor& out) override { inner_->add(x, out); }
  void silu_mul(const Tensor& x, Tensor& out) override { inner_->silu_mul(x, out); }
  void to_float(const Tensor& x, Tensor& out) override { inner_->to_float(x, out); }
  void sigmoid_gate_add(const Tensor& gate, const Tensor& x, Tensor& out) override {
    inner_->sigmoid_gate_add(gate, x, out);
  }
  void prepare_moe(backend::MoeWeights& w) override { inner_->prepare_moe(w); }
  void moe(const Tensor& x, const backend::MoeWeights& w, Tensor& out) override {
    inner_->moe(x, w, out);
  }
  void argmax(const Tensor& logits, Tensor& out) override { inner_->argmax(logits, out); }
  void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) override {
    inner_->gather_rows(x, rows, out);
  }

 private:
  std::unique_ptr<backend::Backend> inner_;
  bool generates_;
};

struct Loaded {
  std::unique_ptr<RecordingBackend> backend;
  std::unique_ptr<model::Model> model;
};

// Loads the fixture with dummy weights of `quant` on rank `rank` of `parallel`.
Loaded load(bool generates, const quant::QuantConfig& quant, dist::ParallelConfig parallel = {},
            int rank = 0) {
  const io::ModelConfig config = io::load_model_config(kFixture);
  auto weights = model::make_dummy_weights(DType::kBF16, 11, quant);
  Loaded out;
  out.backend = std::make_unique<RecordingBackend>(generates);
  model::LoadOptions options;
  options.shard.parallel = parallel;
  std::vector<std::unique_ptr<backend::Communicator>> comms;
  if (parallel.world_size() > 1) {
    comms = backend::make_cpu_communicators(parallel.world_size());
    options.shard.comm = comms[size_t(rank)].get();
    options.shard.coord = dist::rank_coord(parallel, rank);
  }
  out.model = model::create_model(config, *weights, *out.backend, options);
  return out;
}

void expect_same_dense(const RecordingBackend& host, const RecordingBackend& gen) {
  ASSERT_EQ(host.dense.size(), gen.dense.size());
  for (size_t i = 0; i < host.dense.size(); ++i) {
    const Tensor &a = host.dense[i], &b = gen.dense[i];
    ASSERT_EQ(a.dtype, b.dtype) << "upload " << i;
    ASSERT_EQ(a.shape, b.shape) << "upload " << i;
    EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes()), 0) << "upload " << i << " differs";
  }
}

TEST(DummyLoad, DenseMatchesTheHostPathExactly) {
  if (!std::filesystem::exists(kFixture)) GTEST_SKIP() << kFixture << " not found";
  Loaded host = load(false, {}), gen = load(true, {});
  EXPECT_TRUE(host.backend->quantized.empty());
  // embed, final norm, lm_head, then per layer: 2 norms, qkv, o, q/k norms, MLP or router +
  // experts (gate_up, down).
  EXPECT_GT(host.backend->dense.size(), 20u);
  expect_same_dense(*host.backend, *gen.backend);
}

TEST(DummyLoad, TensorAndExpertParallelSlicesMatchTheHostPath) {
  if (!std::filesystem::exists(kFixture)) GTEST_SKIP() << kFixture << " not found";
  // Rank 1 of 2: q/k/v and gate/up rows, o/down columns, LM-head vocab rows, expert
  // intermediate slices (TP), then whole experts 4..7 (EP).
  for (bool ep : {false, true}) {
    const dist::ParallelConfig p{2, 1, ep};
    Loaded host = load(false, {}, p, 1), gen = load(true, {}, p, 1);
    SCOPED_TRACE(ep ? "expert parallel" : "tensor parallel");
    expect_same_dense(*host.backend, *gen.backend);
  }
}

quant::QuantConfig quant_config(Method m) {
  quant::QuantConfig q;
  q.method = m;
  q.source = "test quant config";
  q.group_size = m == Method::kNvfp4 ? 16 : 0;
  if (m == Method::kFp8Block) q.block_size = {32, 32};
  q.static_activations = m != Method::kFp8Block;
  q.exclude_names = {"model.layers.0.mlp.gate", "model.layers.1.mlp.gate"};  // the routers
  return q;
}

// Dequantized values of every weight in `qs`: pooled mean and std.
void dequant_stats(const std::vector<backend::QuantizedWeight>& qs, double* mean, double* std) {
  double sum = 0, sq = 0;
  int64_t count = 0;
  for (const backend::QuantizedWeight& q : qs) {
    const int experts = q.experts > 0 ? q.experts : 1;
    for (int e = 0; e < experts; ++e) {
      kernels::QuantLinearParams p{};
      p.format = q.format;
      p.w = static_cast<const uint8_t*>(q.data.data) + e * q.data_bytes();
      p.scales =
          q.scales.data ? static_cast<const char*>(q.scales.data) + e * q.scale_bytes() : nullptr;
      p.global_scale = q.global_scale.at(size_t(e));
      p.n = q.n;
      p.k = q.k;
      p.block_n = q.block_n;
      p.block_k = q.block_k;
      std::vector<float> row(size_t(q.k));
      for (int r = 0; r < q.n; ++r) {
        kernels::cpu::dequant_weight_row(p, r, row.data());
        for (float v : row) sum += v, sq += double(v) * v, ++count;
      }
    }
  }
  *mean = sum / double(count);
  *std = std::sqrt(sq / double(count) - *mean * *mean);
}

class DummyLoadQuantized : public ::testing::TestWithParam<Method> {};

TEST_P(DummyLoadQuantized, SameShapesScalesAndStatistics) {
  if (!std::filesystem::exists(kFixture)) GTEST_SKIP() << kFixture << " not found";
  const quant::QuantConfig q = quant_config(GetParam());
  Loaded host = load(false, q), gen = load(true, q);
  // Norms, embeddings, routers and the LM head stay dense and identical.
  expect_same_dense(*host.backend, *gen.backend);
  const auto &hq = host.backend->quantized, &gq = gen.backend->quantized;
  // Per layer qkv and o; MoE layers gate_up and down stacks, the dense-MLP layer gate_up, down.
  ASSERT_EQ(hq.size(), 12u);
  ASSERT_EQ(gq.size(), hq.size());
  for (size_t i = 0; i < hq.size(); ++i) {
    SCOPED_TRACE("quantized upload " + std::to_string(i));
    const backend::QuantizedWeight &a = hq[i], &b = gq[i];
    EXPECT_EQ(a.format, b.format);
    EXPECT_EQ(a.experts, b.experts);
    EXPECT_EQ(a.n, b.n);
    EXPECT_EQ(a.k, b.k);
    EXPECT_EQ(a.data.dtype, b.data.dtype);
    EXPECT_EQ(a.data.shape, b.data.shape);
    EXPECT_EQ(a.scales.data != nullptr, b.scales.data != nullptr);
    if (a.scales.data && b.scales.data) {
      EXPECT_EQ(a.scales.dtype, b.scales.dtype);
      EXPECT_EQ(a.scales.shape, b.scales.shape);
    }
    EXPECT_EQ(a.global_scale, b.global_scale);
    EXPECT_EQ(a.input_scale, b.input_scale);
    EXPECT_EQ(a.block_n, b.block_n);
    EXPECT_EQ(a.block_k, b.block_k);
    EXPECT_EQ(a.quantize_activations, b.quantize_activations);
  }
  double host_mean = 0, host_std = 0, mean = 0, std = 0;
  dequant_stats(hq, &host_mean, &host_std);
  dequant_stats(gq, &mean, &std);
  // ~160k values: the sampling error of the std is ~0.3 %; the dummy recipe aims at 0.02
  // (FP8 rounding and the discrete NVFP4 values keep it within a few %).
  EXPECT_NEAR(std, 0.02, 0.002);
  EXPECT_NEAR(std, host_std, 0.0005);
  EXPECT_NEAR(mean, 0.0, 0.0005);

  // Expert parallel (2 data-parallel ranks, rank 1): experts 4..7 whole, attention replicated.
  Loaded host_ep = load(false, q, {1, 2, true}, 1), gen_ep = load(true, q, {1, 2, true}, 1);
  expect_same_dense(*host_ep.backend, *gen_ep.backend);
  ASSERT_EQ(gen_ep.backend->quantized.size(), host_ep.backend->quantized.size());
  for (size_t i = 0; i < gen_ep.backend->quantized.size(); ++i) {
    const backend::QuantizedWeight &a = host_ep.backend->quantized[i],
                                   &b = gen_ep.backend->quantized[i];
    EXPECT_EQ(a.experts, b.experts) << "expert-parallel upload " << i;
    EXPECT_EQ(a.data.shape, b.data.shape) << "expert-parallel upload " << i;
    EXPECT_EQ(a.global_scale, b.global_scale) << "expert-parallel upload " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, DummyLoadQuantized,
                         ::testing::Values(Method::kNvfp4, Method::kFp8PerTensor,
                                           Method::kFp8PerChannel, Method::kFp8Block),
                         [](const ::testing::TestParamInfo<Method>& info) {
                           switch (info.param) {
                             case Method::kNvfp4:
                               return std::string("Nvfp4");
                             case Method::kFp8PerTensor:
                               return std::string("Fp8PerTensor");
                             case Method::kFp8PerChannel:
                               return std::string("Fp8PerChannel");
                             case Method::kFp8Block:
                               return std::string("Fp8Block");
                             case Method::kNone:
                               break;
                           }
                           return std::string("None");
                         });

}  // namespace
}  // namespace serval
