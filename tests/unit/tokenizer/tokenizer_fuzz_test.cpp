// Fuzzing with a fixed seed: random bytes (invalid UTF-8 must be an
// InvalidArgument naming the first bad byte offset, never a crash), random
// valid Unicode compared with the JS oracle, and a 100 KB encode timed.
#include <gtest/gtest.h>

#include <utf8proc.h>

#include <chrono>
#include <random>

#include <fmt/format.h>

#include "base/error.h"
#include "unit/tokenizer/tokenizer_oracle_support.h"

namespace serval::tokenizer::testing {
namespace {

// First invalid byte offset per utf8proc (independent of tokenizer/utf8.cpp), or -1.
long utf8proc_first_invalid(const std::string& s) {
  size_t pos = 0;
  while (pos < s.size()) {
    utf8proc_int32_t cp;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + pos),
                                    static_cast<utf8proc_ssize_t>(s.size() - pos), &cp);
    if (n <= 0 || cp < 0) return static_cast<long>(pos);
    pos += static_cast<size_t>(n);
  }
  return -1;
}

std::string random_bytes(std::mt19937& rng) {
  std::uniform_int_distribution<int> len(0, 40), byte(0, 255), kind(0, 3);
  std::string s;
  const int n = len(rng);
  for (int i = 0; i < n; ++i) {
    // Mostly ASCII and lead/continuation bytes, so valid and invalid both occur.
    const int k = kind(rng);
    const int b = k == 0 ? byte(rng) % 128 : k == 1 ? 0x80 + byte(rng) % 64 : byte(rng);
    s.push_back(static_cast<char>(b));
  }
  return s;
}

// Code points from long-assigned blocks (so every Unicode version agrees);
// no U+0085 or U+FEFF (see oracle_diverges in tokenizer_oracle_test.cpp).
std::string random_unicode(std::mt19937& rng) {
  static const std::vector<std::pair<char32_t, char32_t>> kRanges = {
      {0x20, 0x7E},       {0x09, 0x0D},       {0xA0, 0xFF},     {0x100, 0x17F},   {0x300, 0x36F},
      {0x391, 0x3C9},     {0x410, 0x44F},     {0x5D0, 0x5EA},   {0x621, 0x64A},   {0x660, 0x669},
      {0x905, 0x939},     {0x966, 0x96F},     {0xE01, 0xE30},   {0x2000, 0x200D}, {0x2028, 0x2029},
      {0x3000, 0x3002},   {0x3041, 0x3093},   {0x4E00, 0x4FFF}, {0xAC00, 0xAD00}, {0xFF01, 0xFF5E},
      {0x1F600, 0x1F64F}, {0x1F300, 0x1F320}, {0x30, 0x39}};
  static const char* kSpecial[] = {"<|im_start|>", "<|endoftext|>", "<s>", "</s>", "<|eot_id|>"};
  std::uniform_int_distribution<int> len(0, 30), range(0, static_cast<int>(kRanges.size()) - 1),
      coin(0, 40);
  std::string s;
  const int n = len(rng);
  for (int i = 0; i < n; ++i) {
    if (coin(rng) == 0) {
      s += kSpecial[coin(rng) % 5];
      continue;
    }
    const auto [lo, hi] = kRanges[range(rng)];
    std::uniform_int_distribution<uint32_t> cp(lo, hi);
    utf8::append(s, cp(rng));
  }
  return s;
}

class Fuzz : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    v_ = &vocab(GetParam());
    if (!v_->skip_reason.empty()) GTEST_SKIP() << v_->skip_reason;
  }
  const Vocab* v_ = nullptr;
};

TEST_P(Fuzz, RandomBytesNeverCrash) {
  std::mt19937 rng(20240601);
  int invalid = 0;
  for (int i = 0; i < 3000; ++i) {
    const std::string s = random_bytes(rng);
    const long bad = utf8proc_first_invalid(s);
    if (bad >= 0) {
      ++invalid;
      try {
        v_->tok->encode(s);
        ADD_FAILURE() << "accepted invalid UTF-8 (bad byte at " << bad << ")";
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find(fmt::format("byte offset {}", bad)), std::string::npos)
            << e.what();
      }
    } else {
      const auto ids = v_->tok->encode(s, false);
      if (GetParam() == "llama3_1")  // no normalizer: byte-exact round trip
        EXPECT_EQ(v_->tok->decode(ids, false), s);
    }
  }
  EXPECT_GT(invalid, 1000);
}

TEST_P(Fuzz, RandomUnicodeMatchesOracle) {
  std::mt19937 rng(777);
  std::vector<std::string> strings;
  for (int i = 0; i < 2000; ++i) strings.push_back(random_unicode(rng));
  std::string err;
  const auto rows = run_oracle(GetParam(), strings, err);
  if (!err.empty()) GTEST_SKIP() << err;
  int bad = 0;
  for (size_t i = 0; i < strings.size(); ++i) {
    const auto got = v_->tok->encode(strings[i], true);
    if (got != rows[i].ids_special && ++bad <= 5)
      ADD_FAILURE() << "string " << nlohmann::json(strings[i]).dump();
    EXPECT_EQ(v_->tok->decode(got, false), rows[i].decoded) << i;
  }
  EXPECT_EQ(bad, 0);
}

TEST_P(Fuzz, Encode100KbUnderOneSecond) {
  std::mt19937 rng(99);
  std::string text;
  std::uniform_int_distribution<int> letter(0, 25), wlen(1, 12), kind(0, 9);
  while (text.size() < 100 * 1024) {
    const int k = kind(rng);
    if (k == 0)
      text += std::to_string(rng() % 100000);
    else if (k == 1)
      text += "中文字符";
    else
      for (int i = wlen(rng); i > 0; --i) text.push_back(static_cast<char>('a' + letter(rng)));
    text += k == 2 ? ".\n" : " ";
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = v_->tok->encode(text);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(ids.size(), 10000u);
  EXPECT_LT(s, 1.0) << ids.size() << " tokens";
  EXPECT_EQ(v_->tok->decode(v_->tok->encode(text, false), false), text);
}

INSTANTIATE_TEST_SUITE_P(Vocabs, Fuzz, ::testing::Values("qwen3", "llama3_1", "llama2", "gpt2"));

}  // namespace
}  // namespace serval::tokenizer::testing
