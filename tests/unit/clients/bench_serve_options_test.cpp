// `bench serve` refuses out-of-range numbers and mismatched backends before it contacts the server
// (the base URL below has nothing listening: reaching it would give a connection error instead).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "base/error.h"
#include "clients/bench_serve.h"

namespace serval::clients {
namespace {

TEST(BenchServeOptions, OutOfRangeNumbersFailBeforeConnecting) {
  const std::vector<std::pair<std::function<void(BenchServeOptions&)>, std::string>> bad = {
      {[](BenchServeOptions& o) { o.num_prompts = 0; }, "--num-prompts must be >= 1"},
      {[](BenchServeOptions& o) { o.random_input_len = -1; }, "--random-input-len must be >= 0"},
      {[](BenchServeOptions& o) { o.random_output_len = 0; }, "--random-output-len must be >= 1"},
      {[](BenchServeOptions& o) { o.random_prefix_len = -2; }, "--random-prefix-len must be >= 0"},
      {[](BenchServeOptions& o) { o.random_range_ratio = 1; }, "--random-range-ratio must be in"},
      {[](BenchServeOptions& o) { o.request_rate = -1; }, "--request-rate must be > 0"},
      {[](BenchServeOptions& o) { o.burstiness = 0; }, "--burstiness must be > 0"},
      {[](BenchServeOptions& o) { o.max_concurrency = -3; }, "--max-concurrency must be >= 1"},
      {[](BenchServeOptions& o) { o.num_warmups = -1; }, "--num-warmups must be >= 0"},
      {[](BenchServeOptions& o) { o.request_timeout_s = 0; }, "--request-timeout must be > 0"},
      {[](BenchServeOptions& o) { o.backend = "tgi"; }, "--backend tgi: serval has openai"},
      {[](BenchServeOptions& o) {
         o.backend = "openai-embeddings";
         o.endpoint = "/v1/completions";
       },
       "needs an endpoint ending in embeddings"},
      {[](BenchServeOptions& o) { o.endpoint = "/v1/chat/completions"; },
       "takes chat requests: add --backend openai-chat"},
      {[](BenchServeOptions& o) {
         o.backend = "openai-chat";
         o.endpoint = "/v1/completions";
       },
       "needs an endpoint ending in chat/completions"},
      {[](BenchServeOptions& o) {
         o.backend = "openai-chat";
         o.skip_chat_template = true;
       },
       "the server applies the chat template"},
  };
  for (const auto& [set, needle] : bad) {
    BenchServeOptions o;
    o.base_url = "http://127.0.0.1:1";  // nothing listens on port 1
    set(o);
    try {
      bench_serve(o);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace serval::clients
