// The engine's public API: submit token-id requests, receive streamed outputs, abort, stats.
// The only runtime header the server may include.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace serval::tokenizer {
class Tokenizer;
class ChatTemplate;
}  // namespace serval::tokenizer

namespace serval::runtime {

class JsonGrammar;

// Sampling and stopping rules of one sequence. Stop *strings* are the caller's job (they need
// detokenized text); the engine stops on EOS, stop_token_ids and max_tokens.
struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;        // (0, 1]
  int top_k = 0;             // 0 or -1 = disabled
  float min_p = 0.0f;        // [0, 1]
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::optional<uint64_t> seed;
  int max_tokens = 16;  // new tokens to generate, >= 1
  int min_tokens = 0;   // EOS / stop ids are suppressed until this many were generated
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int logprobs = -1;  // -1: none; k >= 0: the sampled token's logprob plus the top k
  // -1: none; k >= 0: for each prompt token after the first, its logprob given the tokens before
  // it, its rank and the top k (vLLM's prompt_logprobs). The prompt is computed without the
  // prefix cache so that every position has logits.
  int prompt_logprobs = -1;
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, added to its logit)
  std::vector<int32_t> allowed_token_ids;             // empty: all; else only these are sampled
  // vLLM's bad_words, tokenized (bad_word_bans): each sequence's last token is not sampled where
  // the output so far ends with the sequence's other tokens (a one-token word: never).
  std::vector<std::vector<int32_t>> bad_words;
  // Guided decoding: the output must be this JSON (then EOS); null: free text. Needs the model's
  // tokenizer (submit throws InvalidArgument without one).
  std::shared_ptr<const JsonGrammar> json_grammar;
  // With json_grammar: the guidance starts after the output's first "</think>" (a reasoning
  // model thinks freely first, as with vLLM's reasoning parsers).
  bool guided_after_think = false;
  // With json_grammar: no blanks between JSON tokens (vLLM's disable_any_whitespace).
  bool guided_compact_json = false;
  // Not sampling but scheduling: with EngineConfig::priority_scheduling, lower values are served
  // first (vLLM's request `priority`); must be 0 otherwise.
  int priority = 0;
};

// Guided decoding grammars (guided_schema.h): any JSON object, or a JSON Schema given as JSON
// text. Throw InvalidArgument saying what is malformed or not supported.
std::shared_ptr<const JsonGrammar> json_object_grammar();
std::shared_ptr<const JsonGrammar> json_schema_grammar(const std::string& schema_json);
// guided_choice: the output is exactly one of `choices` (raw text, not JSON).
std::shared_ptr<const JsonGrammar> choice_grammar(const std::vector<std::string>& choices);
// guided_regex: the whole output matches `pattern` (the subset of guided_regex.h).
std::shared_ptr<const JsonGrammar> regex_grammar(const std::string& pattern);
// guided_grammar: the output is a sentence of the GBNF grammar `text` (guided_gbnf.h).
std::shared_ptr<const JsonGrammar> gbnf_grammar(const std::string& text);
// tool_choice "required": a JSON list of 1 to max_calls (-1: unbounded) calls
// {"name": N, "parameters": P} of these tools (name, JSON text of its parameters schema).
std::shared_ptr<const JsonGrammar> tool_calls_grammar(
    const std::vector<std::pair<std::string, std::string>>& tools, int max_calls = -1);

enum class FinishReason { kStop, kLength, kAbort };

struct TokenLogprob {
  int32_t token_id;
  float logprob;
};

// Logprob of one generated token and the `SamplingParams::logprobs` most likely alternatives.
struct LogprobEntry {
  TokenLogprob sampled;
  std::vector<TokenLogprob> top;  // descending by logprob
  int rank = 0;                   // 1-based rank of `sampled` in the vocabulary; 0: not computed
};

// One update for a request, delivered in order on the engine thread. The callback must not
// block; it may call Engine::abort.
struct RequestOutput {
  uint64_t request_id = 0;
  std::vector<int32_t> new_token_ids;  // tokens generated since the last update
  std::vector<LogprobEntry> logprobs;  // one per new token when logprobs >= 0
  // On the first update of a request with prompt_logprobs >= 0: entry i for prompt token i + 1.
  std::vector<LogprobEntry> prompt_logprobs;
  std::optional<FinishReason> finish;  // set on the last update
  // Set with kStop when the stop was an EOS or stop_token_id (that token is in new_token_ids).
  std::optional<int32_t> stop_token_id;
  int num_prompt_tokens = 0;
  int num_cached_tokens = 0;  // prompt tokens served from the prefix cache
  std::string error;          // non-empty if the request failed inside the engine
  // EngineConfig::pooling: the final hidden state (after the final norm) of the prompt's last
  // token, [hidden], not normalized; on the request's only update, with FinishReason::kStop.
  std::vector<float> embedding;
};
using OutputCallback = std::function<void(const RequestOutput&)>;

struct EngineConfig {
  std::string model_dir;
  std::string served_model_name;     // empty: model_dir
  std::string dtype = "auto";        // auto | bfloat16 | float16 | float32
  std::string load_format = "auto";  // auto | safetensors | dummy
  std::string device = "auto";       // auto | cpu | cuda
  std::string kv_cache_dtype = "auto";
  std::string moe_backend;  // empty: SERVAL_MOE_BACKEND, else "latency"
  // --quantization (vLLM's flag): empty, or the checkpoint's own format, checked at load
  // (quant::check_requested_quantization).
  std::string quantization;
  std::string generation_config = "auto";  // auto | vllm | a folder
  // --override-generation-config: a JSON object of sampling defaults set over generation_config's
  // (io::parse_generation_config_override); empty: none.
  std::string override_generation_config;
  // --hf-overrides: a JSON object merged into config.json before it is read
  // (io::load_model_config); empty: none.
  std::string hf_overrides;
  // --tokenizer: the folder with tokenizer.json (and tokenizer_config.json); empty = model_dir.
  std::string tokenizer;
  // --chat-template: empty = tokenizer_config.json's; else a file's path or the template itself
  // (tokenizer::chat_template_from_arg).
  std::string chat_template;
  int max_model_len = 0;  // 0: from config.json
  int max_num_seqs = 256;
  int max_num_batched_tokens = 0;   // 0: max(8192, max_model_len)
  int max_waiting_requests = 4096;  // submit() beyond this throws QueueFull
  int block_size = 16;
  float gpu_memory_utilization = 0.9f;
  int64_t cpu_kv_cache_bytes = 0;  // 0: a default sized for the CPU backend
  bool enable_prefix_caching = true;
  // --scheduling-policy priority: requests are admitted, served and spared from preemption by
  // SamplingParams::priority, then arrival (sched::SchedulingPolicy::kPriority); else fcfs.
  bool priority_scheduling = false;
  int max_logprobs = 20;
  uint64_t seed = 0;
  int tensor_parallel_size = 1;
  // Engine replicas behind one front end, each with its own tensor_parallel_size GPUs
  // (replica d uses GPUs d*tp ... d*tp+tp-1). Requests go to the least-loaded replica.
  int data_parallel_size = 1;
  // First GPU index of this engine's ranks (rank r binds GPU first_device + r). Set per replica
  // by the data-parallel engine; ignored on the CPU.
  int first_device = 0;
  bool enable_expert_parallel = false;
  // Multi-node (runtime/multi_node.h): the tensor-parallel ranks split over nnodes processes;
  // node 0 (node_rank 0) serves, and listens for the others on dist_init_addr ("HOST:PORT").
  int nnodes = 1;
  int node_rank = 0;
  std::string dist_init_addr;
  double dist_timeout_s = 300;  // how long node 0 waits for the others (and they for it)
  bool enforce_eager = false;
  bool nvfp4_activations = false;  // W4A4: quantize NVFP4 linears' inputs (SPEC 2.2)
  // Greedy steps queued behind each other with their tokens fed back on the device where the
  // runner allows it (engine.cpp), outputs delivered on their own thread (output_queue.h).
  bool async_scheduling = true;
  std::string cudagraph_mode = "FULL_DECODE_ONLY";
  // --speculative-config: a JSON object (runtime/speculative.h: method "ngram", prompt lookup);
  // empty: off. Each request's drafted positions are sampled as plain decoding samples them and
  // kept where they agree; steps run synchronously (no token feedback).
  std::string speculative_config;
  // --runner pooling: an embedding model. Each request is its prompt alone; its one update
  // carries RequestOutput::embedding and finishes it. No tokens are generated.
  bool pooling = false;
};

// Throws InvalidArgument, naming the `serve` flag, when a numeric field is out of range (sizes
// and counts below their minimum, gpu_memory_utilization outside (0, 1]). load_model calls it
// first; `serve` calls it before anything loads.
void check_engine_config(const EngineConfig& config);

// Facts about the loaded model, for logs, /v1/models and request validation.
struct ModelInfo {
  std::string served_model_name;
  std::string model_dir;
  std::string architecture;
  std::string dtype;
  std::string kv_cache_dtype;
  std::string device;       // "cpu" or "cuda"
  std::string moe_backend;  // effective expert backend; empty for dense models
  int64_t num_parameters = 0;
  int max_model_len = 0;
  int vocab_size = 0;
  int64_t kv_cache_tokens = 0;
  int num_kv_scale_layers = 0;  // layers whose k/v scales came from the checkpoint
  std::vector<int32_t> eos_token_ids;
  SamplingParams default_sampling;  // from generation_config.json
  int max_new_tokens = 0;  // generation config's cap on every request's max_tokens (0: none)
  bool pooling = false;    // EngineConfig::pooling: requests return embeddings
  int hidden_size = 0;     // an embedding's length
};

struct EngineStats {
  int num_running = 0;
  int num_waiting = 0;
  int64_t num_free_blocks = 0;
  int64_t num_total_blocks = 0;
  int64_t prompt_tokens_total = 0;
  int64_t generation_tokens_total = 0;
  int64_t prefix_cache_queries = 0;  // prompt tokens looked up
  int64_t prefix_cache_hits = 0;     // of those, served from cache
  int64_t num_preemptions = 0;
  int64_t steps_total = 0;
  // Wall time of the engine's steps (scheduling, the model, sampling and output bookkeeping) and,
  // within it, of the model runner's calls (device work, copies and launches): the difference is
  // host work during which a synchronous step leaves the device idle (with --async-scheduling a
  // queued step's wait for the step before counts as the model's).
  double step_seconds_total = 0;
  double model_seconds_total = 0;
  // Speculative decoding: requests' drafts checked (one per request and step), the draft tokens
  // in them, and those the model agreed with (vLLM's spec_decode counters).
  int64_t spec_decode_num_drafts = 0;
  int64_t spec_decode_num_draft_tokens = 0;
  int64_t spec_decode_num_accepted_tokens = 0;
};

// Thrown by submit() when the waiting queue is full (HTTP 503).
class QueueFull : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Engine {
 public:
  // Loads the model and tokenizer and starts the engine thread. Throws serval::Error.
  static std::unique_ptr<Engine> create(const EngineConfig& config);
  virtual ~Engine() = default;

  virtual const ModelInfo& info() const = 0;
  // Null when the model folder has no tokenizer.json.
  virtual const tokenizer::Tokenizer* tokenizer() const = 0;
  virtual const tokenizer::ChatTemplate* chat_template() const = 0;

  // Queues a request. Throws InvalidArgument (bad params, prompt + max_tokens too long) or
  // QueueFull. Returns the request id; `on_output` receives every update.
  virtual uint64_t submit(std::vector<int32_t> prompt_token_ids, const SamplingParams& params,
                          OutputCallback on_output) = 0;
  // Aborts a queued or running request; its KV blocks are freed within one step. Its callback
  // receives a final update with FinishReason::kAbort unless it already finished.
  virtual void abort(uint64_t request_id) = 0;

  virtual EngineStats stats() const = 0;
  // Stats of each engine replica (data parallel), in replica order; one entry otherwise.
  virtual std::vector<EngineStats> replica_stats() const { return {stats()}; }
  virtual bool healthy() const = 0;
  // Aborts everything and joins the engine thread.
  virtual void shutdown() = 0;
};

}  // namespace serval::runtime
