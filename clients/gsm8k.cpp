#include "clients/gsm8k.h"

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "base/error.h"
#include "clients/http_client.h"
#include "clients/progress.h"

namespace serval::clients {
namespace fs = std::filesystem;

namespace {

constexpr const char* kDataUrl =
    "https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data/";

}  // namespace

std::vector<Gsm8kItem> load_gsm8k(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw LoadError(fmt::format("cannot open {}", path));
  std::vector<Gsm8kItem> items;
  std::string line;
  for (int line_no = 1; std::getline(f, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("question") || !j.contains("answer") ||
        !j["question"].is_string() || !j["answer"].is_string())
      throw LoadError(
          fmt::format("{}:{}: not a JSON object with string question and answer", path, line_no));
    items.push_back({j["question"].get<std::string>(), j["answer"].get<std::string>()});
  }
  return items;
}

std::optional<std::string> extract_answer(std::string_view text) {
  std::string run, last;
  bool found = false;
  auto close_run = [&] {
    if (!run.empty()) last = run, found = true;
    run.clear();
  };
  for (char c : text) {
    if (c == ',') continue;  // "1,234" is one number
    if (c >= '0' && c <= '9') {
      run.push_back(c);
    } else {
      close_run();
    }
  }
  close_run();
  if (!found) return std::nullopt;
  size_t nz = last.find_first_not_of('0');
  if (nz == std::string::npos) return "0";
  if (nz > 0) return std::nullopt;  // "007": not a Python literal
  return last;
}

std::string build_prompt(const std::vector<Gsm8kItem>& train, int num_shots,
                         std::string_view question) {
  if (num_shots > static_cast<int>(train.size()))
    throw InvalidArgument(
        fmt::format("--num-shots {} but the train set has only {} items", num_shots, train.size()));
  std::string p;
  for (int i = 0; i < num_shots; ++i)
    p += fmt::format("Question: {}\nAnswer: {}\n\n", train[i].question, train[i].answer);
  p += fmt::format("Question: {}\nAnswer:", question);
  return p;
}

std::string gsm8k_data_dir(const std::string& data_dir) {
  if (!data_dir.empty()) {
    for (const char* f : {"train.jsonl", "test.jsonl"})
      if (!fs::exists(fs::path(data_dir) / f))
        throw LoadError(fmt::format("--data-dir {}: {} is missing", data_dir, f));
    return data_dir;
  }
  const char* home = std::getenv("HOME");
  fs::path dir = fs::path(home ? home : ".") / ".cache" / "serval" / "gsm8k";
  for (const char* f : {"train.jsonl", "test.jsonl"}) {
    fs::path p = dir / f;
    if (fs::exists(p)) continue;
    fmt::print(stderr, "Downloading {}{} to {}\n", kDataUrl, f, p.string());
    download_file(std::string(kDataUrl) + f, p.string(), 120);
  }
  return dir.string();
}

Gsm8kResult eval_gsm8k(const Gsm8kOptions& o) {
  if (o.max_concurrency < 1) throw InvalidArgument("--max-concurrency must be >= 1");
  std::string dir = gsm8k_data_dir(o.data_dir);
  std::vector<Gsm8kItem> train = load_gsm8k((fs::path(dir) / "train.jsonl").string());
  std::vector<Gsm8kItem> test = load_gsm8k((fs::path(dir) / "test.jsonl").string());
  int n = o.num_questions < 0 ? static_cast<int>(test.size())
                              : std::min<int>(o.num_questions, static_cast<int>(test.size()));
  std::vector<std::string> prompts(n), responses(n), errors(n);
  for (int i = 0; i < n; ++i) prompts[i] = build_prompt(train, o.num_shots, test[i].question);

  HttpDriver driver;
  ErrorLog error_log;
  ProgressBar bar("gsm8k", n, o.progress);
  const std::string url = o.base_url + "/v1/completions";
  int next = 0, finished = 0;
  double start = now_seconds();
  while (finished < n) {
    while (next < n && driver.in_flight() < o.max_concurrency) {
      int i = next++;
      nlohmann::json body = {{"prompt", prompts[i]},
                             {"max_tokens", o.max_tokens},
                             {"temperature", o.temperature},
                             {"stop", {"Question", "Assistant:", "<|separator|>"}},
                             {"seed", o.seed}};
      if (!o.model.empty()) body["model"] = o.model;
      driver.start({.url = url, .body = body.dump(), .timeout_s = o.request_timeout_s}, nullptr,
                   [&, i](HttpResponse&& r, double) {
                     ++finished;
                     auto j = nlohmann::json::parse(r.body, nullptr, false);
                     if (r.ok() && j.is_object() && j.contains("choices") &&
                         j["choices"].is_array() && !j["choices"].empty() &&
                         j["choices"][0].contains("text") && j["choices"][0]["text"].is_string()) {
                       responses[i] = j["choices"][0]["text"].get<std::string>();
                       return;
                     }
                     errors[i] = !r.error.empty() ? r.error
                                 : r.status != 200
                                     ? fmt::format("HTTP {}: {:.300}", r.status, r.body)
                                     : fmt::format("malformed response: {:.300}", r.body);
                     error_log.record(errors[i]);
                   });
    }
    driver.poll(50);
    bar.update(finished);
  }
  double latency = now_seconds() - start;

  Gsm8kResult res;
  res.num_questions = n;
  res.num_failed_requests = error_log.total();
  nlohmann::json per_question = nlohmann::json::array();
  int correct = 0, invalid = 0;
  for (int i = 0; i < n; ++i) {
    std::optional<std::string> pred = extract_answer(responses[i]);
    std::optional<std::string> label = extract_answer(test[i].answer);
    bool ok = pred == label;
    correct += ok;
    invalid += !pred.has_value();
    per_question.push_back({{"index", i},
                            {"question", test[i].question},
                            {"response", responses[i]},
                            {"prediction", pred ? nlohmann::json(*pred) : nlohmann::json(nullptr)},
                            {"label", label ? nlohmann::json(*label) : nlohmann::json(nullptr)},
                            {"correct", ok},
                            {"error", errors[i]}});
  }
  res.latency_s = latency;
  if (n > 0) {
    res.accuracy = static_cast<double>(correct) / n;
    res.invalid = static_cast<double>(invalid) / n;
    res.questions_per_second = latency > 0 ? n / latency : 0;
  }
  fmt::print("Accuracy: {:.3f}\n", res.accuracy);
  fmt::print("Invalid responses: {:.3f}\n", res.invalid);
  fmt::print("Total latency: {:.3f} s\n", res.latency_s);
  fmt::print("Questions per second: {:.3f}\n", res.questions_per_second);
  std::fflush(stdout);
  if (!o.save_results.empty()) {
    nlohmann::json j = {
        {"accuracy", res.accuracy}, {"invalid", res.invalid},
        {"latency", res.latency_s}, {"questions_per_second", res.questions_per_second},
        {"num_questions", n},       {"num_shots", o.num_shots},
        {"questions", per_question}};
    std::ofstream f(o.save_results);
    f << j.dump(2) << "\n";
    if (!f) throw Error(fmt::format("cannot write {}", o.save_results));
  }
  return res;
}

}  // namespace serval::clients
