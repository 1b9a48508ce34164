#include "runtime/engine_loader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "base/error.h"
#include "base/log.h"
#include "base/math.h"

namespace serval::runtime {

namespace {

constexpr const char* kMoeBackends[] = {"latency", "throughput"};

// MemAvailable from /proc/meminfo in bytes (0 if unknown).
int64_t host_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t value;
  std::string unit;
  while (f >> key >> value >> unit) {
    if (key == "MemAvailable:") return value * 1024;
  }
  return 0;
}

DType resolve_dtype(const EngineConfig& cfg, const io::ModelConfig& model) {
  if (cfg.dtype == "auto") return model.torch_dtype;
  DType t;
  if (!dtype_from_torch_name(cfg.dtype, &t))
    throw InvalidArgument("--dtype: unknown value '" + cfg.dtype +
                          "' (choices: auto, bfloat16, float16, float32)");
  return t;
}

// Activation memory of the largest step (the CUDA step arena): hidden states, the widest MLP
// or MoE intermediate and the MoE workspace for max_num_batched_tokens, with headroom.
int64_t step_memory_bytes(const EngineConfig& cfg, const io::ModelConfig& mc) {
  const int64_t tokens = cfg.max_num_batched_tokens > 0 ? cfg.max_num_batched_tokens : 8192;
  const int64_t widest =
      std::max<int64_t>({int64_t(mc.hidden_size), int64_t(2) * mc.intermediate_size,
                         int64_t(mc.num_experts_per_tok) * 2 * mc.moe_intermediate_size});
  return (512ll << 20) + tokens * widest * 2 * 12;
}

// Bytes for the KV cache. CPU: --kv-cache-memory-bytes or 4 GiB (pages are touched lazily).
// GPU: gpu_memory_utilization of the device, minus what is in use after loading the weights,
// the step arena and 512 MiB for the libraries' own buffers.
int64_t kv_cache_budget(const EngineConfig& cfg, const io::ModelConfig& mc, backend::Backend& b) {
  if (cfg.cpu_kv_cache_bytes > 0) return cfg.cpu_kv_cache_bytes;
  if (b.device() == Device::kCpu) return 4ll << 30;
  int64_t free_bytes = 0, total_bytes = 0;
  b.memory_info(&free_bytes, &total_bytes);
  const int64_t reserve = step_memory_bytes(cfg, mc) + (512ll << 20);
  const int64_t budget = int64_t(double(total_bytes) * cfg.gpu_memory_utilization) -
                         (total_bytes - free_bytes) - reserve;
  log::info(
      "GPU memory: {:.1f} GiB total, {:.1f} GiB free after weights, {:.1f} GiB for the KV "
      "cache",
      total_bytes / double(1ull << 30), free_bytes / double(1ull << 30),
      std::max<int64_t>(budget, 0) / double(1ull << 30));
  if (budget <= 0)
    throw OutOfResources(fmt::format(
        "no GPU memory is left for the KV cache ({:.1f} GiB free of {:.1f} GiB after loading the "
        "weights; --gpu-memory-utilization {})",
        free_bytes / double(1ull << 30), total_bytes / double(1ull << 30),
        cfg.gpu_memory_utilization));
  return budget;
}

}  // namespace

std::string resolve_moe_backend(const std::string& flag) {
  std::string value = flag;
  std::string source = "--moe-backend";
  if (value.empty()) {
    const char* env = std::getenv("SERVAL_MOE_BACKEND");
    if (env && *env) {
      value = env;
      source = "SERVAL_MOE_BACKEND";
    }
  }
  if (value.empty()) return "latency";
  for (const char* c : kMoeBackends)
    if (value == c) return value;
  throw InvalidArgument(
      fmt::format("{}: invalid MoE backend '{}' (choices: latency, throughput)", source, value));
}

LoadedModel load_model(const EngineConfig& cfg) {
  LoadedModel out;
  out.config = io::load_model_config(cfg.model_dir);
  const io::ModelConfig& mc = out.config;
  const DType dtype = resolve_dtype(cfg, mc);
  out.dtype = std::string(dtype_name(dtype));
  out.moe_backend = mc.num_experts > 0 ? resolve_moe_backend(cfg.moe_backend) : "";

  std::unique_ptr<backend::Backend> backend;
  if (cfg.device == "cuda" || (cfg.device == "auto" && backend::cuda_available())) {
    backend = backend::make_cuda_backend();
    if (!backend) throw InvalidArgument("--device cuda: no CUDA GPU is available");
  } else if (cfg.device == "cpu" || cfg.device == "auto") {
    backend = backend::make_cpu_backend();
  } else {
    throw InvalidArgument("--device: unknown value '" + cfg.device +
                          "' (choices: auto, cpu, cuda)");
  }
  out.device = backend->name();

  // Refuse before touching weights when they cannot fit.
  const int64_t params = mc.num_parameters();
  const int64_t weight_bytes = params * dtype_bits(dtype) / 8;
  if (backend->device() == Device::kCpu) {
    const int64_t avail = host_available_bytes();
    log::info("model {}: {} parameters ({:.2f} B), {} weights need {:.2f} GiB", cfg.model_dir,
              params, params / 1e9, out.dtype, weight_bytes / double(1ull << 30));
    if (avail > 0 && weight_bytes > avail * 9 / 10) {
      throw OutOfResources(fmt::format(
          "{}: the model has {:.2f} B parameters and needs {:.2f} GiB for {} weights, but only "
          "{:.2f} GiB of host memory is available",
          cfg.model_dir, params / 1e9, weight_bytes / double(1ull << 30), out.dtype,
          avail / double(1ull << 30)));
    }
  }

  std::unique_ptr<model::WeightSource> weights;
  if (cfg.load_format == "dummy") {
    weights = model::make_dummy_weights(dtype, cfg.seed);
  } else if (cfg.load_format == "auto" || cfg.load_format == "safetensors") {
    weights = model::open_checkpoint_weights(cfg.model_dir);
  } else {
    throw InvalidArgument("--load-format: unknown value '" + cfg.load_format +
                          "' (choices: auto, safetensors, dummy)");
  }
  model::LoadOptions options;
  options.moe_backend = out.moe_backend;
  auto model = model::create_model(mc, *weights, *backend, options);

  out.max_model_len = cfg.max_model_len > 0 ? cfg.max_model_len : mc.max_position_embeddings;
  if (out.max_model_len <= 0) throw LoadError(cfg.model_dir + ": no max_position_embeddings");
  const int64_t per_token =
      ModelRunner::kv_bytes_per_token(model->kv_geometry(), backend->kv_cache_dtype());
  const int64_t kv_bytes = kv_cache_budget(cfg, mc, *backend);
  const int64_t blocks_for_all =
      int64_t(cfg.max_num_seqs) * ceil_div(out.max_model_len, cfg.block_size) + 1;
  out.num_blocks = int(std::min<int64_t>(kv_bytes / (per_token * cfg.block_size), blocks_for_all));
  const int64_t cache_tokens = out.num_blocks * int64_t(cfg.block_size);
  if (cache_tokens < out.max_model_len && cfg.max_model_len == 0) {
    log::warn("max_model_len lowered from {} to {}: the KV cache holds {} tokens",
              out.max_model_len, cache_tokens, cache_tokens);
    out.max_model_len = int(cache_tokens);
  }
  if (cache_tokens < out.max_model_len) {
    throw OutOfResources(fmt::format(
        "KV cache of {} blocks ({} tokens) cannot hold one sequence of max_model_len {}; "
        "lower --max-model-len",
        out.num_blocks, out.num_blocks * cfg.block_size, out.max_model_len));
  }
  RunnerOptions runner;
  if (backend->device() == Device::kCuda) {
    runner.max_model_len = out.max_model_len;
    runner.max_decode_batch = cfg.max_num_seqs;
    runner.cuda_graphs = !cfg.enforce_eager && cfg.cudagraph_mode != "NONE";
    runner.step_memory_bytes = step_memory_bytes(cfg, mc);
  }
  out.runner = std::make_unique<ModelRunner>(std::move(backend), std::move(model), out.num_blocks,
                                             cfg.block_size, runner);
  return out;
}

}  // namespace serval::runtime
