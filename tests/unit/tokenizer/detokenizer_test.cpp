// IncrementalDetokenizer on the fixture tokenizer (tests/fixtures/qwen3_moe)
// and the Qwen3 and Llama-2 vocabularies: the streamed pieces concatenate to
// the one-shot decode, held-back text is bounded, the cost per id is constant.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <chrono>
#include <random>

#include "tokenizer/pre_tokenizer.h"
#include "unit/tokenizer/tokenizer_oracle_support.h"

namespace serval::tokenizer::testing {
namespace {

const std::string kReplacement = "\xEF\xBF\xBD";

struct Streamed {
  std::vector<std::string> pieces;  // push() outputs, then finish()
  std::string text;                 // their concatenation
};

Streamed stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  IncrementalDetokenizer d(tok, skip);
  Streamed s;
  for (int32_t id : ids) s.pieces.push_back(d.push(id));
  s.pieces.push_back(d.finish());
  for (const auto& p : s.pieces) s.text += p;
  return s;
}

std::string ids_str(const std::vector<int32_t>& ids) {
  return fmt::format("[{}]", fmt::join(ids, ","));
}

const Tokenizer& fixture() {
  static const auto tok = Tokenizer::load(SERVAL_SOURCE_DIR "/tests/fixtures/qwen3_moe");
  return *tok;
}

// The token whose text is the single byte `b` (byte-fallback <0xNN> or GPT-2
// byte-level character), or -1.
int32_t byte_token(const Tokenizer& tok, unsigned char b) {
  if (auto id = tok.token_to_id(fmt::format("<0x{:02X}>", b))) return *id;
  if (auto id = tok.token_to_id(byte_to_unicode(b))) return *id;
  return -1;
}

class Detok : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "fixture") {
      tok_ = &fixture();
      return;
    }
    const Vocab& v = vocab(GetParam());
    if (!v.skip_reason.empty()) GTEST_SKIP() << v.skip_reason;
    tok_ = v.tok.get();
  }
  const Tokenizer& tok() const { return *tok_; }
  int32_t byte(unsigned char b) const {
    const int32_t id = byte_token(tok(), b);
    EXPECT_GE(id, 0) << "no token for byte " << int{b};
    return id;
  }
  const Tokenizer* tok_ = nullptr;
};

// The fixture's byte token 228 is 0x83: the e2e run that found the hold-back.
TEST(DetokFixture, Token228IsALoneContinuationByte) {
  EXPECT_EQ(byte_token(fixture(), 0x83), 228);
  EXPECT_EQ(fixture().decode(std::vector<int32_t>{228, 228}), kReplacement + kReplacement);
}

// Byte runs that never become valid: a stray continuation byte, a lead byte
// followed by itself, a never-valid byte, and an invalid byte followed by
// ASCII bytes (byte fallback renders that whole run as U+FFFD). `first` then
// `n - 1` copies of `rest`.
struct ByteRun {
  unsigned char first, rest;
};
constexpr ByteRun kInvalidRuns[] = {{0x83, 0x83}, {0xE4, 0xE4}, {0xF0, 0xF0},
                                    {0xFF, 0xFF}, {0x80, 0x41}, {0xE4, 0x41}};

// After the first two ids every push emits text, at most one character is
// held back, and the pieces add up to decode().
TEST_P(Detok, InvalidByteRunsStreamProgressively) {
  for (const ByteRun& run : kInvalidRuns) {
    std::vector<int32_t> ids(2000, byte(run.rest));
    ids[0] = byte(run.first);
    const std::string what = fmt::format("run {:02X} {:02X}...", run.first, run.rest);
    IncrementalDetokenizer d(tok(), true);
    std::string streamed;
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::string piece = d.push(ids[i]);
      if (i >= 1) {
        ASSERT_FALSE(piece.empty()) << what << ": nothing emitted at push " << i;
      }
      streamed += piece;
      if (i % 97 == 0) {
        const std::string so_far = tok().decode(std::span(ids).first(i + 1), true);
        ASSERT_TRUE(so_far.starts_with(streamed)) << what << " push " << i;
        EXPECT_LE(so_far.size() - streamed.size(), kReplacement.size()) << what << " push " << i;
      }
    }
    streamed += d.finish();
    EXPECT_EQ(streamed, tok().decode(ids, true)) << what;
  }
}

// 20,000 pushes of such runs cost O(1) each (the quadratic version took
// seconds).
TEST_P(Detok, LongInvalidRunIsFast) {
  for (const ByteRun& run : kInvalidRuns) {
    std::vector<int32_t> ids(20000, byte(run.rest));
    ids[0] = byte(run.first);
    IncrementalDetokenizer d(tok(), false);
    std::string streamed;
    const auto start = std::chrono::steady_clock::now();
    for (int32_t id : ids) streamed += d.push(id);
    streamed += d.finish();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string what = fmt::format("run {:02X} {:02X}...", run.first, run.rest);
    EXPECT_EQ(streamed, tok().decode(ids, false)) << what;
    EXPECT_LT(s, 0.5) << what;
  }
}

// Random id sequences mixing any ids, byte tokens and special tokens: the
// pieces are valid UTF-8 and concatenate to decode(), skipping specials or not.
TEST_P(Detok, RandomSequencesMatchOneShotDecode) {
  std::vector<int32_t> any, bytes, specials;
  for (int32_t id = 0; id < tok().vocab_size(); ++id) {
    if (tok().id_to_token(id).empty()) continue;
    any.push_back(id);
    if (tok().is_special(id)) specials.push_back(id);
  }
  for (int b = 0; b < 256; ++b)
    if (int32_t id = byte_token(tok(), static_cast<unsigned char>(b)); id >= 0) bytes.push_back(id);
  ASSERT_EQ(bytes.size(), 256u);
  ASSERT_FALSE(specials.empty());
  // Valid multi-byte characters spelled as byte tokens, so that runs also
  // complete (random bytes rarely do).
  std::vector<std::vector<int32_t>> chars;
  for (std::string_view c : {"\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80", "\xED\x9F\xBF",
                             "\xE0\xA4\x85", "\xF4\x8F\xBF\xBF"}) {
    chars.emplace_back();
    for (char ch : c) chars.back().push_back(byte(static_cast<unsigned char>(ch)));
  }
  std::mt19937 rng(20240607);
  auto pick = [&](const std::vector<int32_t>& v) { return v[rng() % v.size()]; };
  int bad = 0;
  for (int seq = 0; seq < 2000; ++seq) {
    std::vector<int32_t> ids;
    const size_t len = 1 + rng() % 48;
    while (ids.size() < len) {
      const unsigned r = rng() % 100;
      if (r < 35) {
        ids.push_back(pick(any));
      } else if (r < 75) {
        ids.push_back(pick(bytes));
      } else if (r < 85) {
        ids.push_back(pick(specials));
      } else {
        const auto& c = chars[rng() % chars.size()];
        ids.insert(ids.end(), c.begin(), c.end());
      }
    }
    const bool skip = seq % 2 == 0;
    const Streamed s = stream(tok(), ids, skip);
    bool pieces_valid = true;
    for (const auto& p : s.pieces) pieces_valid = pieces_valid && utf8_valid(p);
    const std::string want = tok().decode(ids, skip);
    if ((s.text != want || !pieces_valid) && ++bad <= 5)
      ADD_FAILURE() << "skip=" << skip << " ids " << ids_str(ids) << "\n streamed "
                    << nlohmann::json(s.text).dump() << "\n one-shot "
                    << nlohmann::json(want).dump();
  }
  EXPECT_EQ(bad, 0);
}

// Multi-byte characters spelled as byte tokens, each followed by an ASCII
// token: a character is never emitted broken, and it is emitted by the time
// the ASCII token after it is pushed. Byte-level vocabularies emit it as soon
// as its last byte arrives; byte fallback holds the whole run of byte tokens
// (one later invalid byte would turn it into U+FFFD).
TEST_P(Detok, SplitCharacterIsHeldBackUntilComplete) {
  const std::optional<int32_t> a = tok().token_to_id("a");
  ASSERT_TRUE(a.has_value());
  const bool fallback = tok().token_to_id("<0xE4>").has_value();
  const std::vector<std::string> chars = {"\xC3\xA9",     "\xE4\xB8\xAD", "\xF0\x9F\x98\x80",
                                          "\xE0\xA4\x85", "\xED\x9F\xBF", "\xF4\x8F\xBF\xBF"};
  for (bool skip : {true, false}) {
    IncrementalDetokenizer d(tok(), skip);
    std::string streamed, want;
    for (const std::string& c : chars) {
      for (size_t i = 0; i < c.size(); ++i) {
        const std::string piece = d.push(byte(static_cast<unsigned char>(c[i])));
        EXPECT_TRUE(utf8_valid(piece));
        EXPECT_EQ(piece.find(kReplacement), std::string::npos) << "character broken: " << c;
        streamed += piece;
        const bool complete = i + 1 == c.size();
        EXPECT_EQ(streamed, complete && !fallback ? want + c : want) << "byte " << i << " of " << c;
      }
      want += c;
      const std::string piece = d.push(*a);
      EXPECT_EQ(piece.find(kReplacement), std::string::npos);
      streamed += piece;
      want += "a";
      EXPECT_EQ(streamed, want);
    }
    EXPECT_EQ(d.finish(), "");
  }
}

// Natural tokenizations of text with rare characters (whose tokens split
// UTF-8 sequences in byte-level vocabularies) stream without U+FFFD.
TEST_P(Detok, EncodedTextNeverStreamsReplacementCharacters) {
  const std::string text =
      "\xF0\x9F\xA6\x80 crab, \xE9\xBE\x98 dragon, \xF0\x90\x8D\x88 hwair, "
      "\xE1\x9A\xA0\xE1\x9A\xA2 runes, \xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB end";
  const std::vector<int32_t> ids = tok().encode(text, false);
  for (bool skip : {true, false}) {
    const Streamed s = stream(tok(), ids, skip);
    for (const auto& p : s.pieces) {
      EXPECT_TRUE(utf8_valid(p));
      EXPECT_EQ(p.find(kReplacement), std::string::npos) << nlohmann::json(p).dump();
    }
    EXPECT_EQ(s.text, tok().decode(ids, skip));
  }
}

INSTANTIATE_TEST_SUITE_P(Vocabs, Detok, ::testing::Values("fixture", "qwen3", "llama2"));

}  // namespace
}  // namespace serval::tokenizer::testing
