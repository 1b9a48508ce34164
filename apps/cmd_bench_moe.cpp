// `serval bench moe`: one MoE layer of a config (dummy weights) through each expert backend for a
// range of token counts: µs per layer, achieved GB/s on the weight bytes touched, TFLOP/s, and
// the token count from which `throughput` beats `latency` (run with
// SERVAL_MOE_LATENCY_KERNELS_ONLY=1 to time the latency kernels at every size: by default the
// latency backend hands large steps to the throughput kernels). floor_us = weight bytes touched
// (expected distinct experts under uniform routing) / 4.3 TB/s, the H200 copy bandwidth.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "apps/cli_checks.h"
#include "apps/commands.h"
#include "backend/backend.h"
#include "base/error.h"
#include "io/model_config.h"
#include "model/layers/layers.h"
#include "model/weight_source.h"
#include "quant/quant_config.h"

namespace serval::apps {

namespace {

struct MoeBenchOptions {
  std::string config_dir, device = "auto",
                          tokens = "1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192";
  int iters = 20;
};

std::vector<int> parse_tokens(const std::string& list) {
  std::vector<int> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    int t = std::atoi(item.c_str());
    if (t <= 0) throw InvalidArgument("--tokens: '" + item + "' is not a positive integer");
    out.push_back(t);
  }
  return out;
}

// Seconds per call of `block.forward` on T random tokens (median of three timed batches).
double time_layer(model::MoeBlock& block, backend::Backend& b, int tokens, int hidden, int iters) {
  Tensor host = host_empty(DType::kF32, {tokens, hidden});
  for (int64_t i = 0; i < host.numel(); ++i) host.as<float>()[i] = std::sin(0.37f * float(i));
  Tensor x =
      b.activation_dtype() == DType::kF32 ? host : b.empty(b.activation_dtype(), {tokens, hidden});
  if (b.activation_dtype() == DType::kBF16) {
    Tensor conv = host_empty(DType::kBF16, {tokens, hidden});
    for (int64_t i = 0; i < host.numel(); ++i)
      conv.as<bf16>()[i] = float_to_bf16(host.as<float>()[i]);
    x = b.upload(conv);
  }
  Tensor out = b.empty(b.activation_dtype(), {tokens, hidden});
  // Downloading one element waits for the device to finish the queued layers.
  Tensor first = out;
  first.shape = {1};
  float sink;
  for (int i = 0; i < 3; ++i) block.forward(x, out);  // warm-up
  b.download(first, &sink);
  std::vector<double> runs;
  for (int r = 0; r < 3; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) block.forward(x, out);
    b.download(first, &sink);
    runs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                   iters);
  }
  std::sort(runs.begin(), runs.end());
  return runs[1];
}

void run_bench_moe(const MoeBenchOptions& o) {
  io::ModelConfig c = io::load_model_config(o.config_dir);
  if (c.num_experts == 0) throw InvalidArgument(o.config_dir + " is not an MoE model");
  quant::QuantConfig quant = quant::load_quant_config(o.config_dir);
  std::unique_ptr<backend::Backend> b =
      (o.device == "cuda" || (o.device == "auto" && backend::cuda_available()))
          ? backend::make_cuda_backend()
          : backend::make_cpu_backend();
  if (!b) throw InvalidArgument("--device cuda: no CUDA GPU is available");
  auto weights = model::make_dummy_weights(c.torch_dtype, 1, quant);
  const std::string prefix = "model.layers.0.mlp";  // dummy weights: any name will do
  const model::MoeNames names{prefix + ".gate.weight", prefix + ".experts.{e}.{proj}.weight",
                              "gate_proj", "up_proj", "down_proj"};
  const int E = c.num_experts, k = c.num_experts_per_tok, H = c.hidden_size,
            I = c.moe_intermediate_size;
  const double bytes_per_weight = quant.method == quant::QuantConfig::Method::kNvfp4 ? 0.5625
                                  : quant.method == quant::QuantConfig::Method::kNone
                                      ? dtype_bits(c.torch_dtype) / 8.0
                                      : 1.0;
  std::cout << fmt::format(
      "MoE layer of {}: E={} k={} hidden={} inter={}, {} experts, device {}\n", o.config_dir, E, k,
      H, I, quant.method == quant::QuantConfig::Method::kNone ? "dense" : describe(quant),
      b->name());
  const char* only = std::getenv("SERVAL_MOE_LATENCY_KERNELS_ONLY");
  if (b->device() == Device::kCuda && !(only && std::string(only) == "1"))
    std::cout << "latency: steps past its tokens per expert limit run the throughput kernels "
                 "(SERVAL_MOE_LATENCY_KERNELS_ONLY=1: its own kernels at every size)\n";
  std::cout << fmt::format("{:>6} {:>9} {:>10} | {:>10} {:>8} {:>8} | {:>10} {:>8} {:>8}\n",
                           "tokens", "experts", "floor_us", "latency_us", "GB/s", "TFLOP/s",
                           "through_us", "GB/s", "TFLOP/s");
  model::MoeBlock latency(c, I, *weights, *b, names, "latency");
  model::MoeBlock throughput(c, I, *weights, *b, names, "throughput");
  int crossover = 0;
  for (int T : parse_tokens(o.tokens)) {
    // Expected distinct experts under uniform routing: E·(1 − (1 − k/E)^T).
    const double experts = E * (1.0 - std::pow(1.0 - double(k) / E, T));
    const double bytes = experts * 3.0 * H * I * bytes_per_weight + double(E) * H * 2;
    const double flops = 2.0 * T * k * 3.0 * H * I;
    const double t_lat = time_layer(latency, *b, T, H, o.iters);
    const double t_thr = time_layer(throughput, *b, T, H, o.iters);
    if (crossover == 0 && t_thr < t_lat) crossover = T;
    std::cout << fmt::format(
        "{:>6} {:>9.1f} {:>10.2f} | {:>10.2f} {:>8.0f} {:>8.1f} | {:>10.2f} {:>8.0f} {:>8.1f}\n", T,
        experts, bytes / 4.3e12 * 1e6, t_lat * 1e6, bytes / t_lat / 1e9, flops / t_lat / 1e12,
        t_thr * 1e6, bytes / t_thr / 1e9, flops / t_thr / 1e12);
  }
  std::cout << (crossover
                    ? fmt::format("crossover: throughput is faster from {} tokens\n", crossover)
                    : std::string("crossover: latency is faster at every token count\n"))
            << std::flush;
}

}  // namespace

void register_bench_moe(CLI::App& bench) {
  auto o = std::make_shared<MoeBenchOptions>();
  CLI::App* cmd = bench.add_subcommand("moe", "One MoE layer through each expert backend");
  cmd->add_option("--config,config", o->config_dir, "Model folder with config.json")->required();
  cmd->add_option("--tokens", o->tokens, "Comma-separated token counts");
  cmd->add_option("--device", o->device)->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--iters", o->iters)->check(at_least(1));
  cmd->callback([o] {
    try {
      run_bench_moe(*o);
    } catch (const std::exception& e) {
      std::cerr << "error: " << e.what() << "\n";
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace serval::apps
