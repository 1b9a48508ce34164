// The engine: a step loop on its own thread over the scheduler and the model runner.
#include "runtime/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "runtime/data_parallel_engine.h"
#include "runtime/engine_loader.h"
#include "runtime/guided_output.h"
#include "runtime/guided_vocab.h"
#include "runtime/output_queue.h"
#include "runtime/sampler.h"
#include "runtime/speculative.h"
#include "sched/scheduler.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace serval::runtime {

namespace {

struct EngineRequest {
  sched::Request req;
  SamplingParams params;
  std::shared_ptr<const OutputCallback> on_output;  // shared with queued updates
  SamplerState sampler;
  std::optional<GuidedOutput> json;  // guided decoding: the output so far, matched
  // prompt_logprobs >= 0: entry i for prompt token i + 1, delivered with the first token.
  std::vector<LogprobEntry> prompt_logprobs;
  bool prompt_logprobs_sent = false;
  // Speculative decoding, within one step: the drafts appended at the end of req.token_ids
  // (empty: none, or checked already).
  std::vector<int32_t> drafts;
  bool draft_greedy = false;  // plain_greedy before the drafts were appended
  NgramIndex ngram;           // where each of its tokens occurs, for the drafts

  // Whether this request's prompt positions still need their logits (every row, not the last).
  bool wants_prompt_logits() const { return params.prompt_logprobs >= 0 && !prompt_logprobs_sent; }
};

class EngineImpl final : public Engine {
 public:
  explicit EngineImpl(const EngineConfig& cfg) : EngineImpl(cfg, load_model(cfg)) {}
  // An engine over an already loaded model (a data-parallel replica of a shared group).
  EngineImpl(const EngineConfig& cfg, LoadedModel loaded) : cfg_(cfg) {
    config_ = loaded.config;
    runner_ = std::move(loaded.runner);
    load_tokenizer();
    fill_info(loaded);
    sched::SchedulerConfig sc;
    sc.max_num_seqs = cfg.max_num_seqs;
    sc.max_model_len = loaded.max_model_len;
    sc.max_num_batched_tokens = cfg.max_num_batched_tokens > 0
                                    ? cfg.max_num_batched_tokens
                                    : std::max(8192, loaded.max_model_len);
    sc.num_blocks = loaded.num_blocks;
    sc.block_size = cfg.block_size;
    sc.enable_prefix_caching = cfg.enable_prefix_caching;
    sc.policy = cfg.priority_scheduling ? sched::SchedulingPolicy::kPriority
                                        : sched::SchedulingPolicy::kFcfs;
    scheduler_ = std::make_unique<sched::Scheduler>(sc);
    spec_ = parse_speculative_config(cfg.speculative_config);
    if (spec_.enabled())
      log::info(
          "speculative decoding: prompt lookup (n-grams of {} to {} tokens), up to {} "
          "draft tokens per request and step{}{}",
          spec_.prompt_lookup_min, spec_.prompt_lookup_max, spec_.num_speculative_tokens,
          spec_.disable_by_batch_size > 0
              ? fmt::format(", none while {} or more requests run", spec_.disable_by_batch_size)
              : std::string(),
          cfg.async_scheduling ? "; steps run in turn (drafts need each step's tokens)" : "");
    if (spec_.enabled() && info_.device == "cpu")
      log::warn(
          "speculative decoding on the CPU backend: drafted tokens cost as much as real "
          "ones there, so it saves steps but usually not time");
    if (cfg.async_scheduling) {
      outputs_ = std::make_unique<OutputQueue>();
      token_feedback_ = runner_->supports_token_feedback() && !spec_.enabled();
      log::info("async scheduling: outputs are delivered on their own thread{}",
                token_feedback_
                    ? "; greedy steps are scheduled and launched while the one before runs, their "
                      "tokens fed back on the device"
                    : " (this runner takes each step in turn: no token feedback)");
    }
    update_stats();  // /metrics shows the KV cache's size before the first step
    thread_ = std::thread([this] { loop(); });
  }

  ~EngineImpl() override { shutdown(); }

  const ModelInfo& info() const override { return info_; }
  const tokenizer::Tokenizer* tokenizer() const override { return tokenizer_.get(); }
  const tokenizer::ChatTemplate* chat_template() const override { return chat_template_.get(); }

  uint64_t submit(std::vector<int32_t> prompt, const SamplingParams& params,
                  OutputCallback on_output) override {
    validate(prompt, params);
    auto r = std::make_unique<EngineRequest>();
    r->req.num_prompt_tokens = int(prompt.size());
    r->req.token_ids = std::move(prompt);
    r->req.max_tokens = params.max_tokens;
    r->req.priority = params.priority;
    r->req.skip_prefix_cache = params.prompt_logprobs >= 0;
    if (params.prompt_logprobs >= 0)  // fp32 logits of every position: ≤ 256 MiB per step
      r->req.max_chunk_tokens = std::max(1, int((256 << 20) / (4 * int64_t(config_.vocab_size))));
    r->req.arrival_time = now_seconds();
    r->params = params;
    r->on_output = std::make_shared<const OutputCallback>(std::move(on_output));
    r->sampler.rng.seed(params.seed ? *params.seed : std::random_device{}());
    if (params.json_grammar) {
      if (!tokenizer_) throw InvalidArgument("guided decoding needs the model's tokenizer.json");
      std::call_once(guided_vocab_once_, [this] {
        guided_vocab_ = std::make_unique<GuidedVocab>(GuidedVocab::from_tokenizer(*tokenizer_));
      });
      r->json.emplace(*params.json_grammar, params.guided_after_think, params.guided_compact_json);
    }
    std::lock_guard lock(mu_);
    if (!alive_) throw Error("the engine is not running");
    if (int(incoming_.size()) + waiting_count_ >= cfg_.max_waiting_requests)
      throw QueueFull(
          fmt::format("the waiting queue is full ({} requests)", cfg_.max_waiting_requests));
    r->req.id = ++next_id_;
    uint64_t id = r->req.id;
    incoming_.push_back(std::move(r));
    cv_.notify_one();
    return id;
  }

  void abort(uint64_t id) override {
    std::lock_guard lock(mu_);
    aborts_.push_back(id);
    cv_.notify_one();
  }

  EngineStats stats() const override {
    std::lock_guard lock(stats_mu_);
    return stats_;
  }

  bool healthy() const override { return alive_ && !dead_ && runner_->healthy(); }

  void shutdown() override {
    {
      std::lock_guard lock(mu_);
      alive_ = false;
      cv_.notify_one();
    }
    // Also after a failed step, whose loop already ended (and cleared alive_) on its own.
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  }

 private:
  // The model folder's tokenizer, or --tokenizer's (which must have one); none is fine for a
  // model served by token ids alone.
  void load_tokenizer() {
    namespace fs = std::filesystem;
    const std::string& dir = cfg_.tokenizer.empty() ? cfg_.model_dir : cfg_.tokenizer;
    if (!fs::exists(fs::path(dir) / "tokenizer.json")) {
      if (!cfg_.tokenizer.empty())
        throw InvalidArgument("--tokenizer " + dir + ": no tokenizer.json there");
      if (!cfg_.chat_template.empty())
        throw InvalidArgument("--chat-template: " + dir +
                              " has no tokenizer.json, so no chat can be rendered");
      return;
    }
    tokenizer_ = tokenizer::Tokenizer::load(dir);
    if (!cfg_.chat_template.empty()) {
      const std::string source = tokenizer::chat_template_from_arg(cfg_.chat_template);
      try {
        chat_template_ = std::make_unique<tokenizer::ChatTemplate>(source);
      } catch (const Error& e) {
        throw InvalidArgument(std::string("--chat-template: ") + e.what());
      }
    } else if (!tokenizer_->chat_template_source().empty()) {
      chat_template_ =
          std::make_unique<tokenizer::ChatTemplate>(tokenizer_->chat_template_source());
    }
  }

  void fill_info(const LoadedModel& m) {
    info_.model_dir = cfg_.model_dir;
    info_.served_model_name =
        cfg_.served_model_name.empty() ? cfg_.model_dir : cfg_.served_model_name;
    info_.architecture = config_.architecture;
    info_.dtype = m.dtype;
    info_.kv_cache_dtype = m.kv_cache_dtype;
    info_.num_kv_scale_layers = m.num_kv_scale_layers;
    info_.device = m.device;
    info_.moe_backend = m.moe_backend;
    info_.num_parameters = config_.num_parameters();
    info_.max_model_len = m.max_model_len;
    info_.vocab_size = config_.vocab_size;
    info_.pooling = cfg_.pooling;
    info_.hidden_size = config_.hidden_size;
    info_.kv_cache_tokens = int64_t(m.num_blocks) * cfg_.block_size;
    io::GenerationConfig gen = io::load_generation_config(cfg_.model_dir);
    info_.eos_token_ids = !gen.eos_token_ids.empty() ? gen.eos_token_ids : config_.eos_token_ids;
    if (tokenizer_ && tokenizer_->eos_token_id() &&
        std::find(info_.eos_token_ids.begin(), info_.eos_token_ids.end(),
                  *tokenizer_->eos_token_id()) == info_.eos_token_ids.end())
      info_.eos_token_ids.push_back(*tokenizer_->eos_token_id());
    // Sampling defaults (as vLLM): the model's generation_config.json ("auto"), none ("vllm") or
    // another folder's, then the override's on top.
    if (cfg_.generation_config == "auto") {
      set_sampling_defaults(gen);
    } else if (cfg_.generation_config != "vllm") {
      if (!std::filesystem::is_directory(cfg_.generation_config))
        throw LoadError(fmt::format("--generation-config '{}': not auto, vllm or a folder",
                                    cfg_.generation_config));
      set_sampling_defaults(io::load_generation_config(cfg_.generation_config));
    }
    if (!cfg_.override_generation_config.empty())
      set_sampling_defaults(io::parse_generation_config_override(cfg_.override_generation_config));
  }

  void set_sampling_defaults(const io::GenerationConfig& gen) {
    SamplingParams& d = info_.default_sampling;
    if (gen.temperature) d.temperature = *gen.temperature;
    if (gen.top_p) d.top_p = *gen.top_p;
    if (gen.top_k) d.top_k = *gen.top_k;
    if (gen.min_p) d.min_p = *gen.min_p;
    if (gen.repetition_penalty) d.repetition_penalty = *gen.repetition_penalty;
    if (gen.max_new_tokens) info_.max_new_tokens = *gen.max_new_tokens;
  }

  void validate(const std::vector<int32_t>& prompt, const SamplingParams& p) const {
    if (prompt.empty()) throw InvalidArgument("the prompt is empty");
    for (int32_t id : prompt)
      if (id < 0 || id >= config_.vocab_size)
        throw InvalidArgument(fmt::format("prompt token id {} is outside the vocabulary [0, {})",
                                          id, config_.vocab_size));
    if (p.max_tokens < 1) throw InvalidArgument("max_tokens must be at least 1");
    if (cfg_.pooling && (p.logprobs >= 0 || p.prompt_logprobs >= 0 || p.json_grammar))
      throw InvalidArgument("a pooling engine computes embeddings: no logprobs or guided decoding");
    if (cfg_.pooling && int64_t(prompt.size()) > info_.max_model_len)
      throw InvalidArgument(fmt::format("the prompt ({} tokens) exceeds max_model_len ({})",
                                        prompt.size(), info_.max_model_len));
    if (!cfg_.pooling && int64_t(prompt.size()) + p.max_tokens > info_.max_model_len)
      throw InvalidArgument(
          fmt::format("prompt ({} tokens) + max_tokens ({}) exceeds max_model_len ({})",
                      prompt.size(), p.max_tokens, info_.max_model_len));
    if (p.logprobs > cfg_.max_logprobs)
      throw InvalidArgument(
          fmt::format("logprobs {} exceeds --max-logprobs {}", p.logprobs, cfg_.max_logprobs));
    if (p.prompt_logprobs > cfg_.max_logprobs)
      throw InvalidArgument(fmt::format("prompt_logprobs {} exceeds --max-logprobs {}",
                                        p.prompt_logprobs, cfg_.max_logprobs));
    if (p.priority != 0 && !cfg_.priority_scheduling)
      throw InvalidArgument(fmt::format(
          "priority {} needs --scheduling-policy priority (requests are served first come, first "
          "served)",
          p.priority));
  }

  void loop() {
    try {
      for (;;) {
        if (!take_inputs()) break;
        step();
        update_stats();  // requests that finished in this step must not look running
      }
    } catch (const std::exception& e) {
      log::error("engine step failed: {}", e.what());
      dead_ = true;
      fail_all(e.what());
    }
    abort_everything();
    if (outputs_) outputs_->drain();  // every update is out before the engine counts as stopped
    log_step_time();
  }

  // At shutdown: the steps' wall time and the model's share of it (the rest is host work that a
  // synchronous step does while the device waits).
  void log_step_time() {
    std::lock_guard lock(stats_mu_);
    if (stats_.steps_total == 0) return;
    const double host = stats_.step_seconds_total - stats_.model_seconds_total;
    log::info(
        "engine: {} steps, {:.3f} s in steps, {:.3f} s of it in the model; {:.1f} us of "
        "host work per step",
        stats_.steps_total, stats_.step_seconds_total, stats_.model_seconds_total,
        1e6 * host / double(stats_.steps_total));
  }

  // Moves submitted requests and aborts into the scheduler; waits when idle. False on shutdown.
  bool take_inputs() {
    std::deque<std::unique_ptr<EngineRequest>> incoming;
    std::vector<uint64_t> aborts;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] {
        return !alive_ || !incoming_.empty() || !aborts_.empty() || !requests_.empty() ||
               queued_.has_value();
      });
      if (!alive_) return false;
      incoming.swap(incoming_);
      aborts.swap(aborts_);
    }
    for (auto& r : incoming) {
      EngineRequest* raw = r.get();
      requests_.emplace(raw->req.id, std::move(r));
      scheduler_->add_request(&raw->req);
    }
    for (uint64_t id : aborts) finish(id, FinishReason::kAbort, {});
    update_stats();
    return true;
  }

  // One step: with token feedback, queued behind the step before while every request samples
  // greedily; otherwise (and once the queued step's tokens are in) run to the end.
  void step() {
    if (token_feedback_ && !host_samples_any()) {
      step_queued();
      return;
    }
    if (queued_) collect_queued();
    step_synchronous();
  }

  // The runner's input of each scheduled chunk (spans into the requests and block tables).
  std::vector<SeqChunk> step_chunks(const sched::SchedulerOutput& out) const {
    std::vector<SeqChunk> chunks;
    chunks.reserve(out.chunks.size());
    for (const sched::ScheduledChunk& c : out.chunks) {
      const EngineRequest& r = *requests_.at(c.request->id);
      // Prompt logprobs, or drafts to check: a logits row for every position.
      const bool all =
          (c.start_position < c.request->num_prompt_tokens && r.wants_prompt_logits()) ||
          !r.drafts.empty();
      chunks.push_back({c.request->token_ids, c.start_position, c.num_new_tokens,
                        scheduler_->block_table(c.request->id),
                        all               ? SeqChunk::Logits::kAll
                        : c.samples_token ? SeqChunk::Logits::kLast
                                          : SeqChunk::Logits::kNone});
    }
    return chunks;
  }

  // Prompt tokens are the scheduled positions below num_prompt_tokens (a sampled token is not a
  // scheduled input, so "scheduled - sampled" undercounts by one per prefill). Counted before
  // sampling: a finished request's sched::Request is freed by emit_token.
  static int64_t prompt_tokens_of(const sched::SchedulerOutput& out) {
    int64_t prompt_tokens = 0;
    for (const sched::ScheduledChunk& c : out.chunks)
      prompt_tokens +=
          std::max(0, std::min(c.start_position + c.num_new_tokens, c.request->num_prompt_tokens) -
                          c.start_position);
    return prompt_tokens;
  }

  void add_step_stats(int64_t prompt_tokens, double model_seconds, double start) {
    std::lock_guard lock(stats_mu_);
    stats_.prompt_tokens_total += prompt_tokens;
    stats_.model_seconds_total += model_seconds;
    stats_.step_seconds_total += now_seconds() - start;
    ++stats_.steps_total;
  }

  // Counts tokens about to be emitted before they are delivered: a client that saw its last
  // token sees it counted.
  void count_generated(size_t tokens) {
    std::lock_guard lock(stats_mu_);
    stats_.generation_tokens_total += int64_t(tokens);
  }

  // True when some request's next token is sampled on the host (from logits), so that steps
  // cannot be queued ahead of its tokens.
  bool host_samples_any() const {
    for (const auto& [id, r] : requests_)
      if (!plain_greedy(*r)) return true;
    return false;
  }

  // Token feedback: schedules this step while the queued one runs (its tokens are pending
  // placeholders, −(row + 1), which the device fills in), launches it, and only then waits for
  // the queued step's tokens. Each sampling row appends a placeholder to its request, unless the
  // token is its last by max_tokens (nothing comes after it). A request that stops on EOS or is
  // aborted meanwhile has one more row computed, whose token is dropped.
  void step_queued() {
    const double start = now_seconds();
    sched::SchedulerOutput out = scheduler_->schedule();
    if (out.empty()) {
      if (queued_) {
        collect_queued();
      } else {
        reject_unschedulable();
      }
      return;
    }
    const std::vector<SeqChunk> chunks = step_chunks(out);
    const int64_t prompt_tokens = prompt_tokens_of(out);
    const double model_start = now_seconds();
    runner_->launch_greedy(chunks);
    double model_seconds = now_seconds() - model_start;
    QueuedStep next;
    for (const sched::ScheduledChunk& c : out.chunks) {
      if (!c.samples_token) continue;
      const int32_t placeholder = -int32_t(next.rows.size()) - 1;
      next.rows.push_back(c.request->id);
      sched::Request& req = *c.request;
      if (req.num_output_tokens() + 1 < req.max_tokens) {
        req.token_ids.push_back(placeholder);
        ++req.num_pending_tokens;
      }
    }
    if (queued_) {
      const double wait_start = now_seconds();
      collect_queued();
      model_seconds += now_seconds() - wait_start;
    }
    queued_ = std::move(next);
    add_step_stats(prompt_tokens, model_seconds, start);  // its tokens count when collected
  }

  // Waits for the queued step's tokens and emits them (rows of requests that ended meanwhile are
  // dropped), counting them in the stats.
  void collect_queued() {
    const std::vector<int32_t> ids = runner_->collect_greedy();
    const QueuedStep step = std::move(*queued_);
    queued_.reset();
    std::vector<std::pair<EngineRequest*, int32_t>> tokens;
    for (size_t row = 0; row < step.rows.size(); ++row)
      if (auto it = requests_.find(step.rows[row]); it != requests_.end())
        tokens.emplace_back(it->second.get(), ids.at(row));
    count_generated(tokens.size());
    for (const auto& [r, token] : tokens) emit_token(*r, token, std::nullopt);
  }

  void step_synchronous() {
    const double start = now_seconds();
    if (spec_.enabled()) add_drafts();
    sched::SchedulerOutput out = scheduler_->schedule();
    if (out.empty()) {
      drop_drafts();
      reject_unschedulable();
      return;
    }
    const std::vector<SeqChunk> chunks = step_chunks(out);
    const int64_t prompt_tokens = prompt_tokens_of(out);
    // When every sampled token is a plain argmax, it is taken on the device and only token ids
    // come back (a decode step's logits are batch × vocab floats).
    // (Prompt logprobs need the rows of every position: a step with them is never all greedy.)
    // (A drafted greedy request's rows are argmaxes too: draft_greedy, taken before its drafts
    // counted as outputs.)
    bool all_greedy = true;
    for (size_t i = 0; i < out.chunks.size(); ++i) {
      const sched::ScheduledChunk& c = out.chunks[i];
      const EngineRequest& r = *requests_.at(c.request->id);
      const bool greedy = r.drafts.empty() ? !c.samples_token || plain_greedy(r) : r.draft_greedy;
      if ((chunks[i].logits == SeqChunk::Logits::kAll && r.drafts.empty()) || !greedy)
        all_greedy = false;
    }
    std::vector<int32_t> greedy_ids;
    std::vector<float> logits;
    const double model_start = now_seconds();
    if (all_greedy) {
      greedy_ids = runner_->execute_greedy(chunks);
    } else {
      logits = runner_->execute(chunks);
    }
    const double model_seconds = now_seconds() - model_start;
    if (!cfg_.pooling)
      count_generated(
          size_t(std::count_if(out.chunks.begin(), out.chunks.end(), [&](const auto& c) {
            return c.samples_token && requests_.at(c.request->id)->drafts.empty();
          })));  // drafted requests count what verify_drafts emits
    // A row's width: the vocabulary's (logits) or, pooling, the hidden size.
    const size_t vocab = size_t(cfg_.pooling ? config_.hidden_size : config_.vocab_size);
    size_t row = 0;
    // Each chunk's rows in order: one per position (kAll), its last (kLast) or none; a sampling
    // chunk samples from its last row.
    for (size_t i = 0; i < out.chunks.size(); ++i) {
      const sched::ScheduledChunk& c = out.chunks[i];
      const SeqChunk::Logits mode = chunks[i].logits;
      const size_t rows = mode == SeqChunk::Logits::kAll    ? size_t(c.num_new_tokens)
                          : mode == SeqChunk::Logits::kLast ? 1
                                                            : 0;
      EngineRequest& r = *requests_.at(c.request->id);
      if (!r.drafts.empty()) {  // its last real token and drafts: a token after each
        verify_drafts(r, rows, all_greedy ? &greedy_ids[row] : nullptr,
                      all_greedy ? nullptr : &logits[row * vocab]);
        row += rows;
        continue;
      }
      if (mode == SeqChunk::Logits::kAll)
        add_prompt_logprobs(r, c.start_position, c.num_new_tokens, &logits[row * vocab]);
      if (c.samples_token) {
        const size_t last = row + rows - 1;
        if (all_greedy)
          emit_token(r, greedy_ids[last], std::nullopt);
        else if (cfg_.pooling)
          emit_embedding(r, std::span<const float>(&logits[last * vocab], vocab));
        else
          sample_token(r, std::span<float>(&logits[last * vocab], vocab));
      }
      row += rows;
    }
    drop_drafts();
    add_step_stats(prompt_tokens, model_seconds, start);
  }

  // Speculative decoding: each request about to decode one token gets its prompt-lookup drafts
  // appended before the step is scheduled, as pending tokens (the prefix cache hashes no block
  // holding one until they are real), so that the step computes them too.
  void add_drafts() {
    if (!spec_.drafts_at(scheduler_->running().size())) return;
    const int max_len = scheduler_->config().max_model_len;
    for (sched::Request* r : scheduler_->running()) {
      EngineRequest& er = *requests_.at(r->id);
      if (cfg_.pooling || er.wants_prompt_logits() || r->num_pending_tokens > 0 ||
          r->num_tokens() - r->num_computed_tokens != 1)
        continue;
      // The drafts and the model's own next token must fit max_tokens and the context.
      const int room =
          std::min({spec_.num_speculative_tokens, er.params.max_tokens - r->num_output_tokens() - 1,
                    max_len - r->num_tokens() - 1});
      std::vector<int32_t> drafts = er.ngram.propose(r->token_ids, spec_, room);
      if (drafts.empty()) continue;
      er.draft_greedy = plain_greedy(er);
      r->token_ids.insert(r->token_ids.end(), drafts.begin(), drafts.end());
      r->num_pending_tokens = int(drafts.size());
      er.drafts = std::move(drafts);
      drafted_.push_back(r->id);
    }
  }

  // The step computed the drafted request's last real token and its first rows − 1 drafts: row k
  // gives the token after draft k − 1 (after the real token for k = 0), as greedy_ids[k] (the
  // device's argmax) or from logits row k (sampled on the host as any step's, so with the same
  // penalties, guidance, logprobs and random draws). Tokens are emitted in order while they equal
  // the drafts, and the first that differs (or follows the last checked draft) ends the step's
  // output: exactly what decoding one token per step gives, in fewer steps. The KV of the rejected
  // drafts stays where it is, to be overwritten.
  void verify_drafts(EngineRequest& er, size_t rows, const int32_t* greedy_ids, float* logits) {
    sched::Request& r = er.req;
    const std::vector<int32_t> drafts = take_drafts(er);
    const int base = r.num_tokens(), checked = int(rows) - 1;
    // The last real token's KV now; the accepted drafts' once they are tokens again.
    r.num_computed_tokens = base;
    const uint64_t id = r.id;
    const size_t vocab = size_t(config_.vocab_size);
    int accepted = 0;
    for (int k = 0; k <= checked; ++k) {
      count_generated(1);
      int32_t token;
      if (greedy_ids) {
        token = greedy_ids[k];
        emit_token(er, token, std::nullopt);
      } else {
        token = sample_token(er, std::span<float>(logits + size_t(k) * vocab, vocab));
      }
      const bool agrees = k < checked && token == drafts[size_t(k)];
      accepted += agrees;
      // Finished (EOS, a stop id or max_tokens: `er` is gone), or the drafts end here.
      if (!requests_.contains(id) || !agrees) break;
    }
    {
      std::lock_guard lock(stats_mu_);
      ++stats_.spec_decode_num_drafts;
      stats_.spec_decode_num_draft_tokens += checked;
      stats_.spec_decode_num_accepted_tokens += accepted;
    }
    if (requests_.contains(id)) r.num_computed_tokens = base + accepted;
  }

  // Restores the drafted requests this step did not check (not scheduled, or preempted) to their
  // real tokens.
  void drop_drafts() {
    for (uint64_t id : drafted_) {
      const auto it = requests_.find(id);
      if (it == requests_.end() || it->second->drafts.empty()) continue;
      EngineRequest& er = *it->second;
      take_drafts(er);
      er.req.num_computed_tokens = std::min(er.req.num_computed_tokens, er.req.num_tokens() - 1);
    }
    drafted_.clear();
  }

  // Removes the request's drafts from its tokens (they are pending tokens no more) and returns
  // them.
  static std::vector<int32_t> take_drafts(EngineRequest& er) {
    std::vector<int32_t> drafts = std::move(er.drafts);
    er.drafts.clear();
    er.req.token_ids.resize(er.req.token_ids.size() - drafts.size());
    er.req.num_pending_tokens = 0;
    return drafts;
  }

  // The prompt logprobs of positions [start, start + n) from their logits rows ([n, vocab]): the
  // row of position q scores prompt token q + 1. A recomputed chunk (after a preemption) replaces
  // the entries from `start` on.
  void add_prompt_logprobs(EngineRequest& r, int start, int n, const float* rows) {
    const size_t vocab = size_t(config_.vocab_size);
    r.prompt_logprobs.resize(std::min(r.prompt_logprobs.size(), size_t(start)));
    for (int i = 0; i < n; ++i) {
      const int next = start + i + 1;
      if (next >= r.req.num_prompt_tokens) break;
      r.prompt_logprobs.push_back(
          prompt_token_logprobs(std::span<const float>(rows + size_t(i) * vocab, vocab),
                                r.req.token_ids[size_t(next)], r.params.prompt_logprobs));
    }
  }

  // True when the request's next token is the plain argmax of its logits: greedy, no logprobs,
  // no penalties, nothing banned by min_tokens, no prompt logprobs still to compute.
  bool plain_greedy(const EngineRequest& r) const {
    if (cfg_.pooling) return false;  // the rows are hidden states, taken on the host
    const SamplingParams& p = r.params;
    return p.temperature < 1e-5f && p.logprobs < 0 && !r.wants_prompt_logits() &&
           p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f &&
           p.frequency_penalty == 0.0f && p.logit_bias.empty() && p.allowed_token_ids.empty() &&
           p.bad_words.empty() && !r.json && r.req.num_output_tokens() >= p.min_tokens;
  }

  // Samples, then emits, the request's next token; returns it.
  int32_t sample_token(EngineRequest& r, std::span<float> logits) {
    const SamplingParams& p = r.params;
    std::vector<int32_t> banned;
    const int num_out = r.req.num_output_tokens();
    if (num_out < p.min_tokens) {
      banned = p.stop_token_ids;
      if (!p.ignore_eos)
        banned.insert(banned.end(), info_.eos_token_ids.begin(), info_.eos_token_ids.end());
    }
    add_bad_word_bans(
        p.bad_words,
        std::span<const int32_t>(r.req.token_ids).subspan(size_t(r.req.num_prompt_tokens)), banned);
    std::vector<uint8_t> guided;
    if (r.json && r.json->guiding()) {
      guided = guided_mask(*r.json, p);
      if (r.json->matcher().done()) banned.clear();  // complete: only the end follows
    }
    std::span<const int32_t> prompt(r.req.token_ids.data(), size_t(r.req.num_prompt_tokens));
    SampleResult s = sample(logits, p, r.sampler, prompt, banned, guided);
    if (r.json) advance_guided(r, s.token);
    const int32_t token = s.token;
    emit_token(r, token, std::move(s.logprobs));
    return token;
  }

  // Feeds a sampled token's bytes to the request's guided output (not the end token's).
  void advance_guided(EngineRequest& r, int32_t token) {
    if (token >= guided_vocab_->size() || is_eos(token) || is_stop_id(r.params, token)) return;
    if (!r.json->feed(guided_vocab_->text(token)))
      log::warn("request {}: token {} left its guided grammar", r.req.id, token);
  }

  bool is_eos(int32_t token) const {
    const auto& eos = info_.eos_token_ids;
    return std::find(eos.begin(), eos.end(), token) != eos.end();
  }
  static bool is_stop_id(const SamplingParams& p, int32_t token) {
    return std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) !=
           p.stop_token_ids.end();
  }

  // Guided decoding: the tokens that keep the output on its grammar (JSON, choice, regex, GBNF),
  // and the end (EOS, stop ids) once the output may end there. When nothing fits, the end alone,
  // so the request finishes.
  std::vector<uint8_t> guided_mask(GuidedOutput& out, const SamplingParams& p) const {
    const OutputMatcher& m = out.matcher();
    std::vector<uint8_t> allowed(size_t(std::max(config_.vocab_size, guided_vocab_->size())), 0);
    out.allow_next(*guided_vocab_, allowed);
    const bool stuck = std::find(allowed.begin(), allowed.end(), 1) == allowed.end();
    if (m.can_end() || stuck) {
      for (int32_t id : info_.eos_token_ids)
        if (id >= 0 && id < config_.vocab_size) allowed[size_t(id)] = 1;
      for (int32_t id : p.stop_token_ids)
        if (id >= 0 && id < config_.vocab_size) allowed[size_t(id)] = 1;
    }
    return allowed;
  }

  // Appends `token` to the request (in place of its oldest pending placeholder, if any), streams
  // it out, and finishes the request on EOS, a stop id or max_tokens.
  void emit_token(EngineRequest& r, int32_t token, std::optional<LogprobEntry> logprobs) {
    const SamplingParams& p = r.params;
    if (r.req.num_pending_tokens > 0) {
      r.req.token_ids[r.req.token_ids.size() - size_t(r.req.num_pending_tokens)] = token;
      --r.req.num_pending_tokens;
    } else {
      r.req.token_ids.push_back(token);
    }
    RequestOutput o;
    o.request_id = r.req.id;
    o.new_token_ids = {token};
    if (logprobs) o.logprobs.push_back(std::move(*logprobs));
    if (r.wants_prompt_logits()) {
      o.prompt_logprobs = std::move(r.prompt_logprobs);
      r.prompt_logprobs_sent = true;
    }
    o.num_prompt_tokens = r.req.num_prompt_tokens;
    o.num_cached_tokens = std::max(0, r.req.num_cached_tokens);
    if ((!p.ignore_eos && is_eos(token)) || is_stop_id(p, token)) {
      o.finish = FinishReason::kStop;
      o.stop_token_id = token;
    } else if (r.req.num_output_tokens() - r.req.num_pending_tokens >= p.max_tokens) {
      o.finish = FinishReason::kLength;
    }
    const uint64_t id = r.req.id;
    const bool finished = o.finish.has_value();
    deliver(r.on_output, std::move(o));
    if (finished) {
      scheduler_->finish_request(id);
      requests_.erase(id);
    }
  }

  // Pooling: the request's one update, its prompt's last hidden state; it is done.
  void emit_embedding(EngineRequest& r, std::span<const float> hidden) {
    RequestOutput o;
    o.request_id = r.req.id;
    o.embedding.assign(hidden.begin(), hidden.end());
    o.finish = FinishReason::kStop;
    o.num_prompt_tokens = r.req.num_prompt_tokens;
    o.num_cached_tokens = std::max(0, r.req.num_cached_tokens);
    const uint64_t id = r.req.id;
    deliver(r.on_output, std::move(o));
    scheduler_->finish_request(id);
    requests_.erase(id);
  }

  // Ends request `id` early (abort or error) with a final update.
  void finish(uint64_t id, FinishReason reason, const std::string& error) {
    auto it = requests_.find(id);
    if (it == requests_.end()) return;
    scheduler_->abort_request(id);
    RequestOutput o;
    o.request_id = id;
    o.finish = reason;
    o.error = error;
    o.num_prompt_tokens = it->second->req.num_prompt_tokens;
    auto cb = std::move(it->second->on_output);
    requests_.erase(it);
    deliver(cb, std::move(o));
  }

  // Hands an update to the request's callback: inline, or through the output thread with
  // --async-scheduling (in order either way).
  void deliver(const std::shared_ptr<const OutputCallback>& cb, RequestOutput o) {
    if (outputs_) {
      outputs_->push(cb, std::move(o));
    } else {
      (*cb)(o);
    }
  }

  // Nothing could be scheduled: a waiting request larger than the whole KV cache can never run.
  void reject_unschedulable() {
    if (scheduler_->num_running() > 0 || requests_.empty()) return;
    std::vector<uint64_t> ids;
    for (const auto& [id, r] : requests_) ids.push_back(id);
    for (uint64_t id : ids)
      finish(id, FinishReason::kAbort, "the request does not fit in the KV cache");
  }

  void fail_all(const std::string& why) {
    std::vector<uint64_t> ids;
    for (const auto& [id, r] : requests_) ids.push_back(id);
    for (uint64_t id : ids) finish(id, FinishReason::kAbort, "engine error: " + why);
  }

  void abort_everything() {
    std::deque<std::unique_ptr<EngineRequest>> incoming;
    {
      std::lock_guard lock(mu_);
      alive_ = false;
      incoming.swap(incoming_);
    }
    for (auto& r : incoming) {
      RequestOutput o;
      o.request_id = r->req.id;
      o.finish = FinishReason::kAbort;
      deliver(r->on_output, std::move(o));
    }
    std::vector<uint64_t> ids;
    for (const auto& [id, r] : requests_) ids.push_back(id);
    for (uint64_t id : ids) finish(id, FinishReason::kAbort, {});
    update_stats();
  }

  void update_stats() {
    std::lock_guard lock(stats_mu_);
    stats_.num_running = scheduler_->num_running();
    stats_.num_waiting = scheduler_->num_waiting();
    stats_.num_free_blocks = scheduler_->kv().num_free_blocks();
    stats_.num_total_blocks = scheduler_->kv().num_total_blocks();
    stats_.prefix_cache_queries = scheduler_->kv().prefix_queries();
    stats_.prefix_cache_hits = scheduler_->kv().prefix_hits();
    stats_.num_preemptions = scheduler_->num_preemptions_total();
    std::lock_guard lock2(mu_);
    waiting_count_ = stats_.num_waiting;
  }

  EngineConfig cfg_;
  io::ModelConfig config_;
  ModelInfo info_;
  std::unique_ptr<StepRunner> runner_;  // one rank, or a tensor-parallel group
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  // Guided decoding's view of the vocabulary, built at the first request that needs it.
  std::once_flag guided_vocab_once_;
  std::unique_ptr<GuidedVocab> guided_vocab_;
  std::unique_ptr<tokenizer::ChatTemplate> chat_template_;
  std::unique_ptr<sched::Scheduler> scheduler_;
  std::unique_ptr<OutputQueue> outputs_;  // --async-scheduling only
  // --async-scheduling with a runner that feeds greedy tokens back on the device.
  bool token_feedback_ = false;
  // A greedy step launched but not collected (token feedback): the request of each ids row.
  struct QueuedStep {
    std::vector<uint64_t> rows;
  };
  std::optional<QueuedStep> queued_;
  SpeculativeConfig spec_;
  std::vector<uint64_t> drafted_;  // requests given drafts this step
  std::unordered_map<uint64_t, std::unique_ptr<EngineRequest>> requests_;  // engine thread only

  mutable std::mutex mu_;  // guards the fields below
  std::condition_variable cv_;
  std::deque<std::unique_ptr<EngineRequest>> incoming_;
  std::vector<uint64_t> aborts_;
  uint64_t next_id_ = 0;
  int waiting_count_ = 0;
  std::atomic<bool> alive_{true}, dead_{false};

  mutable std::mutex stats_mu_;
  EngineStats stats_;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<Engine> make_engine(const EngineConfig& config, LoadedModel loaded) {
  return std::make_unique<EngineImpl>(config, std::move(loaded));
}

std::unique_ptr<Engine> Engine::create(const EngineConfig& config) {
  if (config.data_parallel_size != 1) return make_data_parallel_engine(config);
  return std::make_unique<EngineImpl>(config);
}

}  // namespace serval::runtime
