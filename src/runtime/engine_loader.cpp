#include "runtime/engine_loader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "backend/communicator.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/math.h"
#include "model/layers/dummy_load.h"
#include "model/quantized_weight.h"
#include "quant/kv_scales.h"
#include "quant/quant_config.h"
#include "runtime/multi_node.h"
#include "runtime/parallel_runner.h"
#include "runtime/speculative.h"

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

// The per-layer k/v scales the weights hold under any accepted name (SPEC §3); unmappable or
// non-scalar scale tensors are LoadErrors naming them. Dummy weights hold none (all 1.0).
quant::KvScales load_kv_scales(const model::WeightSource& weights, const io::ModelConfig& mc) {
  quant::KvScaleOptions options;
  options.num_layers = mc.num_hidden_layers;
  return quant::load_kv_scales(weights.names(), options,
                               [&](const std::string& name) { return weights.get_stored(name); });
}

// Makes `device` current on the calling (engine) thread before every step: the engine thread
// is not the one that loaded the model, and CUDA's current device is per thread.
class DeviceBoundRunner final : public StepRunner {
 public:
  DeviceBoundRunner(std::unique_ptr<StepRunner> inner, int device)
      : inner_(std::move(inner)), device_(device) {}
  std::vector<float> execute(std::span<const SeqChunk> chunks) override {
    backend::bind_cuda_device(device_);
    return inner_->execute(chunks);
  }
  std::vector<int32_t> execute_greedy(std::span<const SeqChunk> chunks) override {
    backend::bind_cuda_device(device_);
    return inner_->execute_greedy(chunks);
  }
  bool supports_token_feedback() const override { return inner_->supports_token_feedback(); }
  void launch_greedy(std::span<const SeqChunk> chunks) override {
    backend::bind_cuda_device(device_);
    inner_->launch_greedy(chunks);
  }
  std::vector<int32_t> collect_greedy() override {
    backend::bind_cuda_device(device_);
    return inner_->collect_greedy();
  }
  int block_size() const override { return inner_->block_size(); }
  model::Model& model() override { return inner_->model(); }
  const std::vector<backend::KvCacheLayer>& kv_cache() const override { return inner_->kv_cache(); }

 private:
  std::unique_ptr<StepRunner> inner_;
  int device_;
};

// The context a config supports, as vLLM derives it: max_position_embeddings, stretched by a
// linear rope factor; for yarn the original context times the factor.
int default_max_model_len(const io::ModelConfig& mc) {
  const io::RopeScaling& rs = mc.rope_scaling;
  double len = mc.max_position_embeddings;
  if (rs.type == "linear") len *= rs.factor;
  if (rs.type == "yarn") len = double(rs.original_max_position_embeddings) * rs.factor;
  return int(std::min<double>(len, std::numeric_limits<int>::max()));
}

}  // namespace

DType resolve_kv_cache_dtype(const std::string& flag, const backend::Backend& backend,
                             int head_dim) {
  DType t;
  if (flag == "auto") {
    t = backend.kv_cache_dtype();
  } else if (flag == "bfloat16") {
    t = DType::kBF16;
  } else if (flag == "fp8" || flag == "fp8_e4m3") {
    t = DType::kF8E4M3;
  } else if (flag == "fp8_e5m2") {
    t = DType::kF8E5M2;
  } else {
    throw InvalidArgument("--kv-cache-dtype: unknown value '" + flag +
                          "' (choices: auto, bfloat16, fp8, fp8_e4m3, fp8_e5m2)");
  }
  if (backend.device() == Device::kCuda && t != DType::kBF16 && head_dim != 0 && head_dim != 64 &&
      head_dim != 128) {
    throw InvalidArgument("--kv-cache-dtype " + flag +
                          ": the CUDA fp8 KV cache supports head_dim "
                          "64 and 128, the model has " +
                          std::to_string(head_dim));
  }
  return t;
}

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

LoadedModel replica_model(const LoadedModel& first, int d) {
  check(first.dp_ep_group != nullptr, "replica_model: not a data parallel + expert parallel load");
  LoadedModel m;
  m.config = first.config;
  m.num_blocks = first.num_blocks;
  m.max_model_len = first.max_model_len;
  m.moe_backend = first.moe_backend;
  m.device = first.device;
  m.dtype = first.dtype;
  m.kv_cache_dtype = first.kv_cache_dtype;
  m.num_kv_scale_layers = first.num_kv_scale_layers;
  m.dp_ep_group = first.dp_ep_group;
  m.runner = dp_ep_replica(first.dp_ep_group, d);
  return m;
}

void check_engine_config(const EngineConfig& e) {
  const auto at_least = [](const char* flag, int64_t value, int64_t least, const char* note) {
    if (value < least)
      throw InvalidArgument(fmt::format("{} must be >= {}{}, got {}", flag, least, note, value));
  };
  at_least("--max-model-len", e.max_model_len, 0, " (0: from config.json)");
  at_least("--max-num-seqs", e.max_num_seqs, 1, "");
  at_least("--max-num-batched-tokens", e.max_num_batched_tokens, 0,
           " (0: max(8192, --max-model-len))");
  at_least("--max-waiting-requests", e.max_waiting_requests, 1, "");
  at_least("--block-size", e.block_size, 1, "");
  at_least("--kv-cache-memory-bytes", e.cpu_kv_cache_bytes, 0, " (0: the default)");
  at_least("--tensor-parallel-size", e.tensor_parallel_size, 1, "");
  at_least("--data-parallel-size", e.data_parallel_size, 1, "");
  at_least("--nnodes", e.nnodes, 1, "");
  if (!(e.gpu_memory_utilization > 0.0f && e.gpu_memory_utilization <= 1.0f))
    throw InvalidArgument(fmt::format("--gpu-memory-utilization must be in (0, 1], got {}",
                                      e.gpu_memory_utilization));
  if (parse_speculative_config(e.speculative_config).enabled() && e.pooling)
    throw InvalidArgument(
        "--speculative-config: an embedding model (--runner pooling) generates "
        "no tokens to speculate on");
  if (!e.hf_overrides.empty() &&
      !nlohmann::json::parse(e.hf_overrides, nullptr, /*allow_exceptions=*/false).is_object())
    throw InvalidArgument("--hf-overrides must be a JSON object, got " + e.hf_overrides);
}

LoadedModel load_model(const EngineConfig& cfg) {
  check_engine_config(cfg);
  // This process's ranks (tensor parallel, or expert parallel over data-parallel replicas) wait
  // on each other in collectives when there are several: load kernels eagerly, before CUDA starts.
  const int ep_replicas = cfg.enable_expert_parallel ? std::max(1, cfg.data_parallel_size) : 1;
  if (cfg.tensor_parallel_size * ep_replicas > std::max(1, cfg.nnodes))
    backend::prefer_eager_cuda_module_loading();
  LoadedModel out;
  out.config = io::load_model_config(cfg.model_dir, cfg.hf_overrides);
  const io::ModelConfig& mc = out.config;
  const DType dtype = resolve_dtype(cfg, mc);
  out.dtype = std::string(dtype_name(dtype));
  out.moe_backend = mc.num_experts > 0 ? resolve_moe_backend(cfg.moe_backend) : "";

  std::unique_ptr<backend::Backend> backend;
  if (cfg.device == "cuda" || (cfg.device == "auto" && backend::cuda_available())) {
    // Data-parallel replicas start at their own GPU; the backend takes the current device.
    if (cfg.first_device != 0) backend::bind_cuda_device(cfg.first_device);
    backend = backend::make_cuda_backend();
    if (!backend) throw InvalidArgument("--device cuda: no CUDA GPU is available");
  } else if (cfg.device == "cpu" || cfg.device == "auto") {
    backend = backend::make_cpu_backend();
  } else {
    throw InvalidArgument("--device: unknown value '" + cfg.device +
                          "' (choices: auto, cpu, cuda)");
  }
  out.device = backend->name();

  // Refuse before touching weights when they cannot fit. Quantized linears count at their
  // storage size (NVFP4 0.5625 B per weight, FP8 1 B), everything else in the model dtype.
  const quant::QuantConfig quant = quant::load_quant_config(cfg.model_dir);
  quant::check_requested_quantization(quant, cfg.quantization);
  if (quant.method != quant::QuantConfig::Method::kNone || quant.kv_cache_fp8)
    log::info("quantization: {}", quant::describe(quant));
  const int64_t params = mc.num_parameters();
  const int64_t weight_bytes = model::model_weight_bytes(mc, quant, dtype);
  const std::string weight_kind =
      quant.method == quant::QuantConfig::Method::kNone
          ? out.dtype
          : fmt::format("{} + {}", quant::method_name(quant.method), out.dtype);
  if (backend->device() == Device::kCpu) {
    const int64_t avail = host_available_bytes();
    log::info("model {}: {} parameters ({:.2f} B), {} weights need {:.2f} GiB", cfg.model_dir,
              params, params / 1e9, weight_kind, weight_bytes / double(1ull << 30));
    if (avail > 0 && weight_bytes > avail * 9 / 10) {
      throw OutOfResources(fmt::format(
          "{}: the model has {:.2f} B parameters and needs {:.2f} GiB for {} weights, but only "
          "{:.2f} GiB of host memory is available",
          cfg.model_dir, params / 1e9, weight_bytes / double(1ull << 30), weight_kind,
          avail / double(1ull << 30)));
    }
  }

  std::unique_ptr<model::WeightSource> weights;
  if (cfg.load_format == "dummy") {
    weights = model::make_dummy_weights(dtype, cfg.seed, quant);
  } else if (cfg.load_format == "auto" || cfg.load_format == "safetensors") {
    weights = model::open_checkpoint_weights(cfg.model_dir);
  } else {
    throw InvalidArgument("--load-format: unknown value '" + cfg.load_format +
                          "' (choices: auto, safetensors, dummy)");
  }
  if (cfg.nvfp4_activations) {
    weights->enable_nvfp4_activations();
    log::info("--nvfp4-activations: NVFP4 linears quantize their inputs (W4A4)");
  }
  // Replicas load as one group only when they share experts; plain data parallel loads a model
  // per replica (data_parallel_engine.h).
  const int dp = cfg.enable_expert_parallel ? std::max(1, cfg.data_parallel_size) : 1;
  const dist::ParallelConfig parallel{cfg.tensor_parallel_size, dp, cfg.enable_expert_parallel};
  dist::validate(parallel);

  out.max_model_len = cfg.max_model_len > 0 ? cfg.max_model_len : default_max_model_len(mc);
  if (out.max_model_len <= 0) throw LoadError(cfg.model_dir + ": no max_position_embeddings");
  // Attention is full: within the model's sliding window that is the same computation.
  if (mc.sliding_window > 0 && out.max_model_len > mc.sliding_window) {
    if (cfg.max_model_len > 0)
      throw InvalidArgument(fmt::format(
          "--max-model-len {} exceeds the model's sliding window ({} tokens): serval attends to "
          "the whole context, which equals the window's attention only within it; pass "
          "--max-model-len {} or less",
          cfg.max_model_len, mc.sliding_window, mc.sliding_window));
    log::warn(
        "max_model_len lowered from {} to the model's sliding window, {} tokens (serval "
        "attends to the whole context, which equals the window's attention within it)",
        out.max_model_len, mc.sliding_window);
    out.max_model_len = mc.sliding_window;
  }
  // MLA's cache rows go through kernels of their own, whatever the head size.
  const DType kv_dtype =
      resolve_kv_cache_dtype(cfg.kv_cache_dtype, *backend, mc.is_mla() ? 0 : mc.head_dim);
  out.kv_cache_dtype = std::string(dtype_name(kv_dtype));
  RunnerOptions runner;
  runner.kv_cache_dtype = kv_dtype;
  quant::KvScales scales = load_kv_scales(*weights, mc);
  out.num_kv_scale_layers = scales.num_loaded_layers;
  if (kv_dtype == DType::kF8E4M3 || kv_dtype == DType::kF8E5M2) {
    for (const std::string& w : scales.warnings) log::warn("{}", w);
    runner.k_scales = std::move(scales.k);
    runner.v_scales = std::move(scales.v);
  }
  if (backend->device() == Device::kCuda) {
    runner.max_model_len = out.max_model_len;
    runner.max_decode_batch = cfg.max_num_seqs;
    // Pooling runs prompts only: no decode step to capture.
    runner.cuda_graphs = !cfg.enforce_eager && cfg.cudagraph_mode != "NONE" && !cfg.pooling;
    if (runner.cuda_graphs && cfg.cudagraph_mode == "FULL")
      log::warn(
          "cudagraph_mode FULL: serval captures pure-decode steps only; prefill and mixed "
          "steps run eagerly (as with FULL_DECODE_ONLY)");
    runner.step_memory_bytes = step_memory_bytes(cfg, mc);
  }
  // --async-scheduling feeds greedy tokens back on the device (engine.cpp) where the runner
  // allows it: one rank or a tensor-parallel group on one node. Data-parallel replicas sharing
  // experts and several nodes (their step plans carry token values) take steps in turn, so their
  // runners get no feedback buffer and their graphs no resolve kernel.
  if (cfg.async_scheduling && dp == 1 && cfg.nnodes == 1 && !cfg.pooling)
    runner.token_feedback_rows = cfg.max_num_seqs;
  // KV blocks per rank from the backend's budget, once the (rank's) weights are loaded.
  auto num_blocks_for = [&](backend::Backend& b, const model::Model& model) {
    const int64_t per_token = ModelRunner::kv_bytes_per_token(model.kv_geometry(), kv_dtype);
    const int64_t kv_bytes = kv_cache_budget(cfg, mc, b);
    const int64_t blocks_for_all =
        int64_t(cfg.max_num_seqs) * ceil_div(out.max_model_len, cfg.block_size) + 1;
    out.num_blocks =
        int(std::min<int64_t>(kv_bytes / (per_token * cfg.block_size), blocks_for_all));
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
    log::info(
        "KV cache {}: {} blocks of {} tokens; k/v scales from the checkpoint for {} of {} "
        "layers",
        out.kv_cache_dtype, out.num_blocks, cfg.block_size, out.num_kv_scale_layers,
        mc.num_hidden_layers);
    return out.num_blocks;
  };

  if (parallel.world_size() > 1) {
    // Tensor / expert parallel: every rank builds its own backend (one GPU each on CUDA).
    log::info("tensor parallel {}, expert parallel {}", parallel.tp_size,
              parallel.enable_expert_parallel ? "on" : "off");
    ParallelLoadOptions po;
    po.device = backend->device() == Device::kCuda ? "cuda" : "cpu";
    po.parallel = parallel;
    po.moe_backend = out.moe_backend;
    po.pooling = cfg.pooling;
    po.block_size = cfg.block_size;
    po.runner = runner;
    po.num_blocks = num_blocks_for;
    po.first_device = cfg.first_device;
    backend.reset();
    if (dp > 1) {
      if (cfg.nnodes > 1)
        throw InvalidArgument(
            "--data-parallel-size with --enable-expert-parallel over several nodes is not "
            "supported yet");
      log::info(
          "data parallel {} with expert parallel: replicas run their own requests, the "
          "experts are split over all {} ranks",
          dp, parallel.world_size());
      po.dp_attention = true;
      out.dp_ep_group = std::make_shared<DpEpGroup>(load_parallel_runner(mc, *weights, po),
                                                    parallel, out.num_blocks);
      out.num_blocks = out.dp_ep_group->engine_blocks();
      const int cache_tokens = out.num_blocks * cfg.block_size;
      if (cache_tokens < out.max_model_len) {
        if (cfg.max_model_len > 0)
          throw OutOfResources(
              fmt::format("each replica's KV cache holds {} tokens, less than --max-model-len {}",
                          cache_tokens, cfg.max_model_len));
        log::warn("max_model_len lowered from {} to {}: each replica's KV cache holds {} tokens",
                  out.max_model_len, cache_tokens, cache_tokens);
        out.max_model_len = cache_tokens;
      }
      out.runner = dp_ep_replica(out.dp_ep_group, 0);
      return out;
    }
    out.runner = cfg.nnodes > 1 ? load_multi_node_runner(cfg, mc, *weights, po, num_blocks_for)
                                : load_parallel_runner(mc, *weights, po);
    return out;
  }
  model::LoadOptions options;
  options.moe_backend = out.moe_backend;
  options.pooling = cfg.pooling;
  const double weights_start = now_seconds();
  auto model = model::create_model(mc, *weights, *backend, options);
  log::info("weights {} in {:.1f} s",
            model::device_dummy(*weights, *backend) ? "generated on the device (dummy)" : "loaded",
            now_seconds() - weights_start);
  num_blocks_for(*backend, *model);
  const bool rebind = backend->device() == Device::kCuda && cfg.first_device != 0;
  const double runner_start = now_seconds();
  out.runner = std::make_unique<ModelRunner>(std::move(backend), std::move(model), out.num_blocks,
                                             cfg.block_size, runner);
  log::info("KV cache allocated{} in {:.1f} s",
            runner.cuda_graphs ? " and decode graphs captured" : "", now_seconds() - runner_start);
  if (rebind)
    out.runner = std::make_unique<DeviceBoundRunner>(std::move(out.runner), cfg.first_device);
  return out;
}

}  // namespace serval::runtime
