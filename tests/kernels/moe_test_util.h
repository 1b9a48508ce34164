// Helpers of the MoE GPU tests: device buffers, a fixed-seed generator, error norms, and the
// harness the bf16 and NVFP4 expert tests share around moe_forward_cuda (a layer's router and
// expert slice, one call's inputs and workspace, the CPU comparison, the graph replay check).
#pragma once
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/moe/moe_cpu.h"
#include "backend/moe/moe_cuda.h"
#include "base/dtype.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda_test_util.h"

namespace serval::testing::moe_util {

// Throws std::runtime_error "what: CUDA error" unless e is cudaSuccess.
inline void cuda_ok(cudaError_t e, const char* what) {
  cuda_check(e, what);
}

// Owning device allocation.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    cuda_ok(cudaMalloc(&ptr_, bytes ? bytes : 1), "cudaMalloc");
  }
  // A device copy of `host` (host.size() · sizeof(T) bytes).
  template <typename T>
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size() * sizeof(T)) {
    upload(host);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  // upload, download and poison fence the whole device: they run on the legacy stream, which
  // kernels on non-blocking streams do not wait for.
  template <typename T>
  void upload(const std::vector<T>& v) {
    cuda_ok(cudaDeviceSynchronize(), "before upload");
    cuda_ok(cudaMemcpy(ptr_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
    cuda_ok(cudaDeviceSynchronize(), "upload");
  }
  template <typename T>
  std::vector<T> download(size_t n) const {
    cuda_ok(cudaDeviceSynchronize(), "before download");
    std::vector<T> v(n);
    cuda_ok(cudaMemcpy(v.data(), ptr_, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return v;
  }
  void poison() {
    cuda_ok(cudaDeviceSynchronize(), "before poison");
    cuda_ok(cudaMemset(ptr_, 0xFF, bytes_), "poison");
    cuda_ok(cudaDeviceSynchronize(), "poison");
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

// xorshift64*: fast, fixed-seed, good enough for test data.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint32_t next() {
    s_ ^= s_ >> 12;
    s_ ^= s_ << 25;
    s_ ^= s_ >> 27;
    return uint32_t((s_ * 0x2545F4914F6CDD1Dull) >> 32);
  }
  float uniform() { return float(next()) * (2.0f / 4294967296.0f) - 1.0f; }  // [-1, 1)
  float normal() {  // Irwin–Hall approximation: mean 0, variance 1
    float s = 0;
    for (int i = 0; i < 12; ++i) s += float(next()) * (1.0f / 4294967296.0f);
    return s - 6.0f;
  }

 private:
  uint64_t s_;
};

// Random bf16 values uniform in [-scale, scale).
inline std::vector<bf16> random_bf16(size_t n, float scale, Rng& rng) {
  std::vector<bf16> v(n);
  for (auto& x : v) x = float_to_bf16(scale * rng.uniform());
  return v;
}

// bf16 → f32, and ‖got − want‖₂ / ‖want‖₂ (+inf for NaN/inf in `got`): cuda_test_util.h's.
using serval::testing::rel_l2;
using serval::testing::to_float;

// Owning non-blocking stream.
class Stream {
 public:
  Stream() { cuda_ok(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "stream"); }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// ---- moe_forward_cuda harness (moe_forward_test.cpp, moe_nvfp4_test.cpp) ----

using backend::MoeWeights;
using backend::moe::moe_forward_cpu;
using backend::moe::moe_forward_cuda;
using backend::moe::moe_step_kernels;
using backend::moe::moe_workspace_bytes;
using backend::moe::MoeCudaArgs;
using backend::moe::MoeCudaBackend;
using kernels::RoutingMethod;

struct MoeShape {
  int experts, top_k, hidden, inter;
};
constexpr MoeShape kMoeSmall{8, 2, 256, 128};     // Mixtral-like, scaled down
constexpr MoeShape kMoeQwen3{128, 8, 2048, 768};  // Qwen3-30B-A3B layer

// Router [experts, hidden] f32 of bf16-rounded values uniform in [-1, 1), drawn from `rng`; or
// all zero (`zero`: every logit ties, so every token picks experts 0..top_k-1; draws nothing).
inline std::vector<float> random_router(MoeShape s, Rng& rng, bool zero = false) {
  std::vector<float> r(size_t(s.experts) * s.hidden);
  for (auto& v : r) v = zero ? 0.0f : bf16_to_float(float_to_bf16(rng.uniform()));
  return r;
}

// One MoE layer as the forward tests see it: its shape, this rank's experts [local_offset,
// local_offset + num_local), the router on the host (for the reference logits and the CPU
// reference), and the local experts in whatever form a test builds; the test exposes them through
// the two hooks, host views to moe_forward_cpu and device pointers to moe_forward_cuda. The
// layer owns all of it and must outlive the weights and args built from it.
struct MoeTestLayer {
  MoeShape s;
  int local_offset, num_local;
  std::vector<float> router;  // [experts, hidden] f32 (bf16-rounded values); set by the test

  MoeTestLayer(MoeShape shape, int offset, int local)
      : s(shape), local_offset(offset), num_local(local) {}
  virtual ~MoeTestLayer() = default;
  MoeTestLayer(const MoeTestLayer&) = delete;
  MoeTestLayer& operator=(const MoeTestLayer&) = delete;

  // Sets the expert fields of w (gate_up / down, or gate_up_q / down_q): host views.
  virtual void set_cpu_experts(MoeWeights& w) const = 0;
  // Sets the expert fields of a (gate_up / down, or format and gate_up_q / down_q): device.
  virtual void set_cuda_experts(MoeCudaArgs& a) const = 0;

  // moe_forward_cpu's weights for this layer (views into it).
  MoeWeights cpu_weights(RoutingMethod method = RoutingMethod::kSoftmaxTopK,
                         bool renormalize = true) const {
    MoeWeights w;
    w.router = host_view(router.data(), DType::kF32, {s.experts, s.hidden}, nullptr);
    set_cpu_experts(w);
    w.num_experts = s.experts;
    w.top_k = s.top_k;
    w.hidden = s.hidden;
    w.inter = s.inter;
    w.routing = method;
    w.renormalize = renormalize;
    w.local_offset = local_offset;
    w.num_local = num_local;
    return w;
  }
};

// Inputs and outputs of one moe_forward_cuda call of `tokens` tokens on a layer: x [tokens,
// hidden] bf16 uniform in [-1, 1) from `seed`; router logits [tokens, experts] f32 computed on the
// CPU exactly as moe_forward_cpu computes them (same function, same inputs); device copies of
// both, the output [tokens, hidden] bf16 and a workspace of moe_workspace_bytes(tokens, …) bytes.
struct MoeCall {
  int tokens;
  std::vector<bf16> x;
  std::vector<float> logits;
  DeviceBuffer d_x, d_logits, d_out, d_ws;

  MoeCall(const MoeTestLayer& l, int T, uint64_t seed)
      : tokens(T),
        d_x(size_t(T) * l.s.hidden * 2),
        d_logits(size_t(T) * l.s.experts * 4),
        d_out(size_t(T) * l.s.hidden * 2),
        d_ws(moe_workspace_bytes(T, l.s.top_k, l.num_local, l.s.hidden, l.s.inter)) {
    Rng rng(seed);
    x = random_bf16(size_t(T) * l.s.hidden, 1.0f, rng);
    std::vector<float> xf = to_float(x);
    logits.resize(size_t(T) * l.s.experts);
    kernels::cpu::linear({xf.data(), l.router.data(), DType::kF32, nullptr, logits.data(), T,
                          l.s.experts, l.s.hidden});
    d_x.upload(x);
    d_logits.upload(logits);
  }

  // The call's arguments: this call's buffers, the layer's shape, slice and experts; `backend`'s
  // own kernels at every token count (no hand-over of large latency steps).
  MoeCudaArgs args(const MoeTestLayer& l, MoeCudaBackend backend,
                   RoutingMethod method = RoutingMethod::kSoftmaxTopK,
                   bool renormalize = true) const {
    MoeCudaArgs a;
    a.x = d_x.as<bf16>();
    a.router_logits = d_logits.as<float>();
    a.out = d_out.as<bf16>();
    a.gate_up = nullptr;
    a.down = nullptr;
    l.set_cuda_experts(a);
    a.num_tokens = tokens;
    a.num_experts = l.s.experts;
    a.top_k = l.s.top_k;
    a.hidden = l.s.hidden;
    a.inter = l.s.inter;
    a.routing = method;
    a.renormalize = renormalize;
    a.local_offset = l.local_offset;
    a.num_local = l.num_local;
    a.backend = backend;
    a.large_steps_on_throughput = false;
    a.workspace = d_ws.as<void>();
    a.workspace_bytes = d_ws.bytes();
    return a;
  }

  // Poisons the output, runs `a` eagerly on the default stream, returns the output as f32.
  std::vector<float> run(const MoeCudaArgs& a) {
    d_out.poison();
    moe_forward_cuda(a, nullptr);
    cuda_ok(cudaDeviceSynchronize(), "moe_forward_cuda");
    return to_float(d_out.download<bf16>(size_t(tokens) * a.hidden));
  }
};

// One call of `tokens` tokens (inputs from `seed`) on `backend` against moe_forward_cpu on every
// `stride`-th token (tokens are independent; stride keeps ≤ ~128 rows): rel L2 < tol, or exact
// zeros where nothing is routed to this rank. `what` names the case in failure messages. Fatal
// failures return from this function only.
inline void expect_forward_matches_cpu(const MoeTestLayer& l, int tokens, uint64_t seed,
                                       MoeCudaBackend backend, const char* what, double tol,
                                       RoutingMethod method = RoutingMethod::kSoftmaxTopK,
                                       bool renormalize = true) {
  MoeCall c(l, tokens, seed);
  const std::vector<float> gpu = c.run(c.args(l, backend, method, renormalize));
  const int H = l.s.hidden;
  const int stride = std::max(1, c.tokens / 128);
  std::vector<int> rows;
  for (int t = 0; t < c.tokens; t += stride) rows.push_back(t);
  std::vector<float> xs(rows.size() * H), ref(rows.size() * H), got(rows.size() * H);
  for (size_t i = 0; i < rows.size(); ++i)
    for (int h = 0; h < H; ++h) {
      xs[i * H + h] = bf16_to_float(c.x[size_t(rows[i]) * H + h]);
      got[i * H + h] = gpu[size_t(rows[i]) * H + h];
    }
  const MoeWeights w = l.cpu_weights(method, renormalize);
  moe_forward_cpu(xs.data(), int(rows.size()), w, ref.data());
  double ref_norm = 0;
  for (float v : ref) ref_norm += double(v) * v;
  if (ref_norm == 0) {  // nothing routed to this rank: exact zeros expected
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], 0.0f) << what << " elem " << i;
    return;
  }
  for (size_t i = 0; i < got.size(); ++i) ASSERT_TRUE(std::isfinite(got[i])) << what << " " << i;
  const double err = rel_l2(got, ref);
  EXPECT_LT(err, tol) << what << ": tokens " << c.tokens;
}

// One call of `tokens` tokens (inputs from `seed`, softmax top-k, renormalized) run eagerly on
// `backend` (which also sets the kernels' attributes outside the capture), then captured once in
// a CUDA graph on a non-blocking stream and replayed three times, the output and the workspace
// poisoned before each (the routing maps must be rebuilt every replay): each replay's output must
// equal the eager one bit for bit. Fatal failures return from this function only (callers wrap
// it in ASSERT_NO_FATAL_FAILURE to stop the test).
inline void expect_graph_replay_equals_eager(const MoeTestLayer& l, int tokens, uint64_t seed,
                                             MoeCudaBackend backend, const char* what) {
  MoeCall c(l, tokens, seed);
  const MoeCudaArgs a = c.args(l, backend);
  c.run(a);
  const std::vector<uint16_t> eager = c.d_out.download<uint16_t>(size_t(tokens) * a.hidden);

  const Stream stream;
  const CapturedGraph graph(stream.get(), [&](cudaStream_t s) { moe_forward_cuda(a, s); });
  for (int rep = 0; rep < 3; ++rep) {
    c.d_out.poison();
    c.d_ws.poison();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // poison done before `stream` runs
    graph.launch(stream.get());
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
    const auto replay = c.d_out.download<uint16_t>(size_t(tokens) * a.hidden);
    ASSERT_EQ(replay, eager) << what << " tokens " << tokens << " replay " << rep;
  }
}

// The engine's latency backend (large_steps_on_throughput) on `tokens` tokens: moe_step_kernels
// must name `expected`, and the output must equal, bit for bit, that of `expected`'s own kernels
// on the same inputs (the hand-over changes which kernels run, nothing else).
inline void expect_latency_step_runs(const MoeTestLayer& l, int tokens, uint64_t seed,
                                     MoeCudaBackend expected) {
  MoeCall c(l, tokens, seed);
  MoeCudaArgs engine = c.args(l, MoeCudaBackend::kLatency);
  engine.large_steps_on_throughput = true;
  ASSERT_EQ(int(moe_step_kernels(engine)), int(expected)) << tokens << " tokens";
  c.run(engine);
  const auto got = c.d_out.download<uint16_t>(size_t(tokens) * engine.hidden);
  c.run(c.args(l, expected));
  const auto want = c.d_out.download<uint16_t>(size_t(tokens) * engine.hidden);
  ASSERT_EQ(got, want) << tokens << " tokens";
}

}  // namespace serval::testing::moe_util
