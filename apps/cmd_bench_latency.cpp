// `serval bench latency`: B sequences through one prefill step and N decode steps on the model
// runner (no HTTP, no scheduler), reporting prefill throughput, TTFT and TPOT.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <random>

#include "apps/cli_checks.h"
#include "apps/commands.h"
#include "base/error.h"
#include "base/math.h"
#include "runtime/engine_loader.h"

namespace serval::apps {

namespace {

struct LatencyOptions {
  runtime::EngineConfig engine;
  int batch_size = 8, input_len = 32, output_len = 128, iters = 3, warmup_iters = 1;
};

struct IterationTimes {
  double prefill_s = 0;
  std::vector<double> decode_s;
};

// B random prompts of input_len tokens and their KV block tables (each sequence its own blocks).
struct Batch {
  std::vector<std::vector<int32_t>> tokens, tables;
};
Batch random_batch(const runtime::StepRunner& runner, const LatencyOptions& o, int vocab,
                   std::mt19937& rng) {
  const int B = o.batch_size;
  const int blocks_per_seq = ceil_div(o.input_len + o.output_len, runner.block_size());
  Batch batch{std::vector<std::vector<int32_t>>(B), std::vector<std::vector<int32_t>>(B)};
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  for (int s = 0; s < B; ++s) {
    for (int i = 0; i < o.input_len; ++i) batch.tokens[s].push_back(id(rng));
    for (int b = 0; b < blocks_per_seq; ++b) batch.tables[s].push_back(s * blocks_per_seq + b);
  }
  return batch;
}

IterationTimes run_iteration(runtime::StepRunner& runner, const LatencyOptions& o, int vocab,
                             std::mt19937& rng) {
  const int B = o.batch_size;
  auto [tokens, tables] = random_batch(runner, o, vocab, rng);
  IterationTimes times;
  for (int step = 0; step < o.output_len; ++step) {
    std::vector<runtime::SeqChunk> chunks;
    for (int s = 0; s < B; ++s) {
      const int start = step == 0 ? 0 : int(tokens[s].size()) - 1;
      chunks.push_back({tokens[s], start, int(tokens[s].size()) - start, tables[s],
                        runtime::SeqChunk::Logits::kLast});
    }
    auto t0 = std::chrono::steady_clock::now();
    std::vector<int32_t> next = runner.execute_greedy(chunks);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    (step == 0 ? times.prefill_s : times.decode_s.emplace_back()) = dt;
    for (int s = 0; s < B; ++s) tokens[s].push_back(next[s]);
  }
  return times;
}

// --async-scheduling: each decode step is launched before the previous one is collected, its
// inputs the previous step's ids, fed back on the device; a step's time is the interval between
// two collections (the prefill's and the first decode step's as in run_iteration).
IterationTimes run_iteration_queued(runtime::StepRunner& runner, const LatencyOptions& o, int vocab,
                                    std::mt19937& rng) {
  const int B = o.batch_size;
  auto [tokens, tables] = random_batch(runner, o, vocab, rng);
  IterationTimes times;
  std::vector<runtime::SeqChunk> chunks;
  for (int s = 0; s < B; ++s)
    chunks.push_back({tokens[s], 0, o.input_len, tables[s], runtime::SeqChunk::Logits::kLast});
  auto last = std::chrono::steady_clock::now();
  runner.launch_greedy(chunks);
  // Pending placeholders resolve in launch order: sequence s's is row s of its step.
  auto collect = [&](int pending_at) {
    const std::vector<int32_t> next = runner.collect_greedy();
    for (int s = 0; s < B; ++s) tokens[s][size_t(pending_at)] = next[s];
    const auto now = std::chrono::steady_clock::now();
    const double dt = std::chrono::duration<double>(now - last).count();
    (pending_at == o.input_len ? times.prefill_s : times.decode_s.emplace_back()) = dt;
    last = now;
  };
  for (int s = 0; s < B; ++s) tokens[s].push_back(-s - 1);
  for (int step = 1; step < o.output_len; ++step) {
    chunks.clear();
    const int pos = o.input_len + step - 1;  // the previous step's token, still pending
    for (int s = 0; s < B; ++s)
      chunks.push_back({tokens[s], pos, 1, tables[s], runtime::SeqChunk::Logits::kLast});
    runner.launch_greedy(chunks);
    for (int s = 0; s < B; ++s) tokens[s].push_back(-s - 1);
    collect(pos);
  }
  collect(o.input_len + o.output_len - 1);
  return times;
}

std::string parallel_note(const runtime::EngineConfig& e) {
  if (e.tensor_parallel_size == 1 && !e.enable_expert_parallel) return "";
  return fmt::format(", tensor parallel {}{}", e.tensor_parallel_size,
                     e.enable_expert_parallel ? " + expert parallel" : "");
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void run_latency(LatencyOptions o) {
  const int blocks_per_seq = ceil_div(o.input_len + o.output_len, o.engine.block_size);
  o.engine.max_num_seqs = o.batch_size;
  if (o.engine.max_model_len == 0) o.engine.max_model_len = o.input_len + o.output_len;
  // The largest step is the batch's prefill: size the activation reserve for it, not for the
  // serving default (8192 tokens), so large models leave room for their KV cache.
  if (o.engine.max_num_batched_tokens == 0)
    o.engine.max_num_batched_tokens = o.batch_size * o.input_len;
  const auto load_start = std::chrono::steady_clock::now();
  runtime::LoadedModel m = runtime::load_model(o.engine);
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  if (m.num_blocks < o.batch_size * blocks_per_seq)
    throw OutOfResources(fmt::format("the KV cache has {} blocks, the run needs {}", m.num_blocks,
                                     o.batch_size * blocks_per_seq));
  const bool queued = o.engine.async_scheduling && m.runner->supports_token_feedback();
  if (o.engine.async_scheduling && !queued)
    std::cerr << "--async-scheduling: this runner has no token feedback; steps run in turn\n";
  std::mt19937 rng(1234);
  std::vector<double> prefill, tpot;
  for (int it = 0; it < o.warmup_iters + o.iters; ++it) {
    IterationTimes t = queued ? run_iteration_queued(*m.runner, o, m.config.vocab_size, rng)
                              : run_iteration(*m.runner, o, m.config.vocab_size, rng);
    if (it < o.warmup_iters) continue;
    prefill.push_back(t.prefill_s);
    tpot.push_back(median(t.decode_s));
  }
  const double ttft = median(prefill);
  std::cout << fmt::format(
                   "model {} ({}), device {}, dtype {}{}{}, loaded in {:.1f} s\n"
                   "batch {} input {} output {}: prefill {:.1f} tok/s, TTFT {:.2f} ms, TPOT median "
                   "{:.3f} ms "
                   "({:.1f} tok/s per sequence, {:.1f} tok/s total)\n",
                   o.engine.model_dir, m.config.architecture, m.device, m.dtype,
                   m.moe_backend.empty() ? "" : ", MoE backend " + m.moe_backend,
                   parallel_note(o.engine), load_s, o.batch_size, o.input_len, o.output_len,
                   o.batch_size * o.input_len / ttft, ttft * 1e3, median(tpot) * 1e3,
                   1.0 / median(tpot), o.batch_size / median(tpot))
            << std::flush;
}

}  // namespace

void register_bench_latency(CLI::App& bench) {
  auto o = std::make_shared<LatencyOptions>();
  CLI::App* cmd = bench.add_subcommand("latency", "Prefill and decode latency of the model runner");
  cmd->add_option("--model,model", o->engine.model_dir, "Model folder")->required();
  cmd->add_option("--load-format", o->engine.load_format)
      ->check(CLI::IsMember({"auto", "safetensors", "dummy"}));
  cmd->add_option("--batch-size", o->batch_size)->check(at_least(1));
  cmd->add_option("--input-len", o->input_len)->check(at_least(1));
  cmd->add_option("--output-len", o->output_len)->check(at_least(1));
  cmd->add_option("--num-iters", o->iters)->check(at_least(1));
  cmd->add_option("--num-iters-warmup", o->warmup_iters)->check(at_least(0));
  cmd->add_option("--dtype", o->engine.dtype);
  cmd->add_option("--device", o->engine.device)->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--kv-cache-dtype", o->engine.kv_cache_dtype);
  cmd->add_option("--moe-backend", o->engine.moe_backend)->envname("SERVAL_MOE_BACKEND");
  cmd->add_option("--max-model-len", o->engine.max_model_len);
  cmd->add_option("--max-num-batched-tokens", o->engine.max_num_batched_tokens,
                  "tokens of the largest step (default: batch size × input length)")
      ->check(at_least(1));
  cmd->add_option("--gpu-memory-utilization", o->engine.gpu_memory_utilization);
  cmd->add_flag("--enforce-eager", o->engine.enforce_eager);
  cmd->add_flag("--async-scheduling,!--no-async-scheduling", o->engine.async_scheduling,
                "Launch each decode step before the previous one's tokens reach the host (fed "
                "back on the device; on by default)");
  cmd->add_option("--tensor-parallel-size", o->engine.tensor_parallel_size)->check(at_least(1));
  cmd->add_flag("--enable-expert-parallel", o->engine.enable_expert_parallel);
  cmd->add_flag("--nvfp4-activations", o->engine.nvfp4_activations);
  add_quantization_option(cmd, o->engine.quantization);
  cmd->callback([o] {
    try {
      run_latency(*o);
    } catch (const std::exception& e) {
      std::cerr << "error: " << e.what() << "\n";
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace serval::apps
