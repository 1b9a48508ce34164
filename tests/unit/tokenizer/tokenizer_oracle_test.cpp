// Compares encode/decode/streaming with the JS Hugging Face tokenizers oracle
// on a seeded corpus (>= 2,000 strings) for Qwen3, Llama-3.1, Llama-2 and GPT-2.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "unit/tokenizer/tokenizer_oracle_support.h"

namespace serval::tokenizer::testing {
namespace {

std::string ids_str(const std::vector<int32_t>& ids) {
  return fmt::format("[{}]", fmt::join(ids, ","));
}

struct OracleCase {
  const Vocab* v = nullptr;
  std::vector<OracleRow> rows;
  std::string skip;
};

// Loads the vocab and runs the oracle over the corpus once per vocab.
const OracleCase& oracle_case(const std::string& name) {
  static std::map<std::string, OracleCase> cache;
  if (auto it = cache.find(name); it != cache.end()) return it->second;
  OracleCase c;
  c.v = &vocab(name);
  if (!c.v->skip_reason.empty()) {
    c.skip = c.v->skip_reason;
  } else if (corpus().empty()) {
    c.skip = "node not found or gen_corpus.mjs failed: no corpus";
  } else {
    std::string err;
    c.rows = run_oracle(name, corpus(), err);
    if (!err.empty()) c.skip = err;
  }
  return cache.emplace(name, std::move(c)).first->second;
}

class Oracle : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    c_ = &oracle_case(GetParam());
    if (!c_->skip.empty()) GTEST_SKIP() << c_->skip;
  }
  const Tokenizer& tok() const { return *c_->v->tok; }
  const OracleCase* c_ = nullptr;
};

constexpr int kMaxReports = 8;

// Known divergence of the JS oracle from Python HF tokenizers: its ByteLevel
// pre-tokenizer (GPT-2, use_regex) runs a hard-coded native JS regex whose \s
// matches U+FEFF and misses U+0085, while Oniguruma's \s is Unicode White_Space
// (the reverse). Its Split pre-tokenizer rewrites \s to \p{White_Space}, so
// Qwen3/Llama-3 are compared on these strings too.
bool oracle_diverges(const std::string& vocab_name, const std::string& s) {
  return vocab_name == "gpt2" &&
         (s.find("\xEF\xBB\xBF") != std::string::npos || s.find("\xC2\x85") != std::string::npos);
}

TEST_P(Oracle, CorpusIsLargeEnough) {
  EXPECT_GE(corpus().size(), 2000u);
}

TEST_P(Oracle, EncodeMatches) {
  int bad = 0;
  for (size_t i = 0; i < corpus().size(); ++i) {
    const auto& s = corpus()[i];
    if (oracle_diverges(GetParam(), s)) continue;
    const auto& want = c_->rows[i];
    const auto got = tok().encode(s, false);
    const auto got_special = tok().encode(s, true);
    if (got != want.ids || got_special != want.ids_special) {
      if (++bad <= kMaxReports)
        ADD_FAILURE() << "line " << i << " text " << nlohmann::json(s).dump() << "\n got  "
                      << ids_str(got) << "\n want " << ids_str(want.ids) << "\n got+special  "
                      << ids_str(got_special) << "\n want+special " << ids_str(want.ids_special);
    }
  }
  EXPECT_EQ(bad, 0) << "of " << corpus().size() << " strings";
}

TEST_P(Oracle, DecodeMatches) {
  int bad = 0;
  for (size_t i = 0; i < corpus().size(); ++i) {
    const auto& want = c_->rows[i];
    const std::string got = tok().decode(want.ids_special, false);
    const std::string got_skip = tok().decode(want.ids_special, true);
    const std::string got_clean = tok().decode(want.ids, false, true);
    if (got != want.decoded || got_skip != want.decoded_skip || got_clean != want.decoded_clean) {
      if (++bad <= kMaxReports)
        ADD_FAILURE() << "line " << i << " ids " << ids_str(want.ids_special) << "\n got  "
                      << nlohmann::json(got).dump() << " / " << nlohmann::json(got_skip).dump()
                      << " / " << nlohmann::json(got_clean).dump() << "\n want "
                      << nlohmann::json(want.decoded).dump() << " / "
                      << nlohmann::json(want.decoded_skip).dump() << " / "
                      << nlohmann::json(want.decoded_clean).dump();
    }
  }
  EXPECT_EQ(bad, 0) << "of " << corpus().size() << " strings";
}

// decode(encode(s)) == s wherever the oracle round-trips.
TEST_P(Oracle, RoundTrip) {
  int checked = 0, bad = 0;
  for (size_t i = 0; i < corpus().size(); ++i) {
    const auto& s = corpus()[i];
    if (c_->rows[i].decoded_skip != s) continue;
    ++checked;
    if (tok().decode(tok().encode(s, true), true) != s && ++bad <= kMaxReports)
      ADD_FAILURE() << "line " << i << " does not round-trip: " << nlohmann::json(s).dump();
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(checked, static_cast<int>(corpus().size()) / 2) << "too few oracle round trips";
}

// The streamed pieces concatenate to the one-shot decode, with and without
// special tokens skipped, and every piece is valid UTF-8.
TEST_P(Oracle, IncrementalEqualsOneShot) {
  int bad = 0;
  for (size_t i = 0; i < corpus().size(); ++i) {
    const auto& ids = c_->rows[i].ids_special;
    for (bool skip : {true, false}) {
      IncrementalDetokenizer detok(tok(), skip);
      std::string streamed;
      bool pieces_valid = true;
      for (int32_t id : ids) {
        const std::string piece = detok.push(id);
        pieces_valid = pieces_valid && utf8_valid(piece);
        streamed += piece;
      }
      streamed += detok.finish();
      const std::string want = tok().decode(ids, skip);
      if ((streamed != want || !pieces_valid) && ++bad <= kMaxReports)
        ADD_FAILURE() << "line " << i << " skip=" << skip << "\n streamed "
                      << nlohmann::json(streamed).dump() << "\n one-shot "
                      << nlohmann::json(want).dump();
    }
  }
  EXPECT_EQ(bad, 0);
}

// Guided decoding's view of tokens: each token's bytes, concatenated, are the text wherever it
// round-trips (SentencePiece vocabularies keep the space their encoding prepends), byte for
// byte, including characters split across byte tokens.
TEST_P(Oracle, TokenBytesConcatenateToTheText) {
  int checked = 0, bad = 0;
  for (size_t i = 0; i < corpus().size(); ++i) {
    const auto& s = corpus()[i];
    if (c_->rows[i].decoded_skip != s) continue;
    const std::vector<int32_t> ids = tok().encode(s, false);
    if (tok().decode(ids, true) != s) continue;
    std::string joined;
    for (int32_t id : ids) joined += tok().token_bytes(id);
    const std::string want = GetParam() == "llama2" && !ids.empty() ? " " + s : s;
    ++checked;
    if (joined != want && ++bad <= kMaxReports)
      ADD_FAILURE() << "line " << i << ": " << nlohmann::json(s).dump() << " ids " << ids_str(ids)
                    << " joined " << nlohmann::json(joined).dump();
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(checked, static_cast<int>(corpus().size()) / 2);
}

INSTANTIATE_TEST_SUITE_P(Vocabs, Oracle, ::testing::Values("qwen3", "llama3_1", "llama2", "gpt2"));

}  // namespace
}  // namespace serval::tokenizer::testing
