// bench serve's file datasets: custom JSONL and ShareGPT files read with clear errors, prompts
// tokenized (here by a stand-in tokenizer: one token per byte, three more for a chat template),
// vLLM's ShareGPT length rules, repetition up to --num-prompts, order by --seed.
#include "clients/bench_text_dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "base/error.h"

namespace serval::clients {
namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path =
      (std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()))).string();
  std::ofstream(path, std::ios::trunc) << text;
  return path;
}

std::vector<int> byte_tokens(const std::string& text, bool as_chat) {
  std::vector<int> ids(text.begin(), text.end());
  if (as_chat) ids.insert(ids.end(), {1, 2, 3});
  return ids;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "no error";
}

TEST(BenchTextDataset, CustomPromptsAsChatRepeatedToNumPrompts) {
  const std::string path =
      write_temp("custom.jsonl", "{\"prompt\": \"hello\", \"id\": 1}\n\n{\"prompt\": \"hi\"}\n");
  const std::vector<TextPrompt> prompts = read_custom_dataset(path);
  ASSERT_EQ(prompts.size(), 2u);
  const auto requests = text_requests(
      prompts, {.num_prompts = 5, .output_len = 7, .chat_template = true, .seed = 3}, byte_tokens);
  ASSERT_EQ(requests.size(), 5u);
  for (const BenchRequest& r : requests) {
    EXPECT_EQ(r.output_len, 7);
    EXPECT_TRUE(r.prompt.size() == 8 || r.prompt.size() == 5) << r.prompt.size();  // + template
  }
  EXPECT_EQ(requests[2].prompt, requests[0].prompt);  // the two, then repeated
  // The order follows the seed.
  bool differs = false;
  for (uint64_t seed = 0; seed < 8 && !differs; ++seed)
    differs =
        text_requests(prompts, {.num_prompts = 2, .output_len = 7, .seed = seed}, byte_tokens)[0]
            .prompt !=
        text_requests(prompts, {.num_prompts = 2, .output_len = 7, .seed = 0}, byte_tokens)[0]
            .prompt;
  EXPECT_TRUE(differs);
  std::filesystem::remove(path);

  const std::string bad = write_temp("bad.jsonl", "{\"prompt\": \"ok\"}\n{\"text\": \"x\"}\n");
  EXPECT_NE(message_of([&] { read_custom_dataset(bad); }).find("line 2"), std::string::npos);
  std::filesystem::remove(bad);
  EXPECT_NE(message_of([] { read_custom_dataset("/nonexistent/x.jsonl"); }).find("cannot open"),
            std::string::npos);
}

TEST(BenchTextDataset, ShareGptLengthsAndFilters) {
  const std::string path = write_temp("sharegpt.json", R"([
    {"conversations": [{"from": "human", "value": "What is up?"},
                       {"from": "gpt", "value": "Not much, you?"}]},
    {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello there"}]},
    {"conversations": [{"from": "human", "value": "only one turn"}]},
    {"id": "no conversations"}
  ])");
  const std::vector<TextPrompt> prompts = read_sharegpt_dataset(path);
  ASSERT_EQ(prompts.size(), 2u);  // entries without two turns are left out
  const auto requests =
      text_requests(prompts, {.num_prompts = 3, .sharegpt_filter = true}, byte_tokens);
  ASSERT_EQ(requests.size(), 3u);  // "Hi" (2 tokens) is too short; the other, repeated
  for (const BenchRequest& r : requests) {
    EXPECT_EQ(r.prompt.size(), std::string("What is up?").size());
    EXPECT_EQ(r.output_len, int(std::string("Not much, you?").size()));
  }
  const auto fixed = text_requests(
      prompts, {.num_prompts = 1, .output_len = 9, .sharegpt_filter = true}, byte_tokens);
  EXPECT_EQ(fixed[0].output_len, 9);
  std::filesystem::remove(path);

  const std::string none = write_temp("none.json", R"([{"conversations": []}])");
  EXPECT_NE(message_of([&] { read_sharegpt_dataset(none); }).find("no conversation"),
            std::string::npos);
  std::filesystem::remove(none);
  EXPECT_NE(message_of([] {
              text_requests({{"Hi", std::string("Yo")}},
                            {.num_prompts = 2, .sharegpt_filter = true}, byte_tokens);
            }).find("no prompt"),
            std::string::npos);
}

}  // namespace
}  // namespace serval::clients
