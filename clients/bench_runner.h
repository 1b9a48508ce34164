// Sends the benchmark's requests (streaming completions) under a load pattern and records
// each one's timeline.
#pragma once
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "clients/bench_dataset.h"
#include "clients/bench_metrics.h"

namespace serval::clients {

struct LoadOptions {
  std::string url;    // full endpoint URL, e.g. http://127.0.0.1:8000/v1/completions
  std::string model;  // "model" field; empty: left out
  bool chat = false;  // chat completions (each request's text as one user message)
  // /v1/embeddings: one non-streamed request per prompt (its token ids as `input`); success is a
  // response with its embedding, latency the time to it, no output tokens.
  bool embeddings = false;
  bool ignore_eos = false;
  double request_rate = std::numeric_limits<double>::infinity();  // req/s; inf: all at once
  double burstiness = 1;  // gamma shape of the gaps (1: Poisson)
  std::optional<int> max_concurrency;
  uint64_t seed = 0;  // for the gaps
  double request_timeout_s = 600;
  bool progress = false;  // progress bar on stderr (TTY only)
};

struct BenchRun {
  std::vector<RequestOutcome> outcomes;  // in request order
  double start_s = 0;                    // first dispatch (steady clock)
  double duration_s = 0;                 // first dispatch -> last completion
};

// The JSON body of one request: stream with usage, temperature 0, at most output_len tokens;
// completions send the prompt's token ids, chat its text as one user message; embeddings only
// the ids, as `input`.
std::string request_body(const BenchRequest& r, const LoadOptions& o);

// Arrival offsets (s, from the first dispatch) of `n` requests: all 0 for an infinite rate,
// else cumulative gamma(shape=burstiness, mean=1/rate) gaps after a first request at 0.
std::vector<double> arrival_offsets(int n, double rate, double burstiness, uint64_t seed);

// Runs all requests on one thread; each failure message goes to stderr once. Never hangs:
// every request is bounded by request_timeout_s.
BenchRun run_requests(const std::vector<BenchRequest>& requests, const LoadOptions& o);

}  // namespace serval::clients
