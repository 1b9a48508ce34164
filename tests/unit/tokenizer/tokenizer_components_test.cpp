// Hand-computed checks of the pieces the real vocabularies do not exercise:
// added-token flags, Split behaviors, Digits, Metaspace, byte fallback with
// fuse_unk, ignore_merges, templates with EOS, config parsing, errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace serval::tokenizer {
namespace {

using nlohmann::json;
using Ids = std::vector<int32_t>;

// vocab: <unk>=0 a=1 b=2 c=3 ab=4 bc=5 abc=6 ▁=7 ▁a=8 <0xC3>=9 <0xA9>=10 " "=12
json tiny_model() {
  return {{"type", "BPE"},
          {"unk_token", "<unk>"},
          {"fuse_unk", true},
          {"byte_fallback", true},
          {"vocab",
           {{"<unk>", 0},
            {"a", 1},
            {"b", 2},
            {"c", 3},
            {"ab", 4},
            {"bc", 5},
            {"abc", 6},
            {"\xE2\x96\x81", 7},
            {"\xE2\x96\x81"
             "a",
             8},
            {"<0xC3>", 9},
            {"<0xA9>", 10},
            {" ", 12}}},
          {"merges", {"a b", "ab c", "\xE2\x96\x81 a", "b c"}}};
}

std::unique_ptr<Tokenizer> make(json tj, json cfg = json()) {
  tj["model"] = tj.contains("model") ? tj["model"] : tiny_model();
  return Tokenizer::from_json(tj.dump(), cfg.is_null() ? "" : cfg.dump());
}

json added(const std::string& content, int id, bool special, json flags = json::object()) {
  json t = {{"content", content}, {"id", id},        {"special", special},  {"normalized", false},
            {"lstrip", false},    {"rstrip", false}, {"single_word", false}};
  t.update(flags);
  return t;
}

TEST(BpeMerges, RankOrderAndByteFallbackAndFusedUnk) {
  auto t = make(json::object());
  EXPECT_EQ(t->encode("abc"), (Ids{6}));           // a b -> ab, ab c -> abc
  EXPECT_EQ(t->encode("bcab"), (Ids{5, 4}));       // (a,b) rank 0 before (b,c) rank 3
  EXPECT_EQ(t->encode("\xC3\xA9"), (Ids{9, 10}));  // é -> <0xC3><0xA9>
  EXPECT_EQ(t->encode("a\xE2\x82\xAC\xE2\x82\xAC"
                      "b"),
            (Ids{1, 0, 2}));  // €€: one fused <unk>
}

TEST(BpeMerges, IgnoreMergesTakesWholeWord) {
  json m = tiny_model();
  m["vocab"]["cab"] = 13;
  m["ignore_merges"] = false;
  EXPECT_EQ(make({{"model", m}})->encode("cab"), (Ids{3, 4}));
  m["ignore_merges"] = true;
  EXPECT_EQ(make({{"model", m}})->encode("cab"), (Ids{13}));
}

TEST(AddedTokens, StripFlagsSingleWordAndSkip) {
  auto t = make({{"added_tokens",
                  {added("<x>", 20, true, {{"lstrip", true}, {"rstrip", true}}),
                   added("ba", 21, false, {{"single_word", true}})}}});
  EXPECT_EQ(t->encode("a <x> b"), (Ids{1, 20, 2}));
  EXPECT_EQ(t->encode("a<x>b"), (Ids{1, 20, 2}));
  EXPECT_EQ(t->encode("ba b"), (Ids{21, 12, 2}));
  EXPECT_EQ(t->encode("aba"), (Ids{4, 1}));  // "ba" inside a word is not the added token
  EXPECT_EQ(t->decode(Ids{1, 20, 2}, false), "a <x> b");  // no decoder: joined by spaces
  EXPECT_EQ(t->decode(Ids{1, 20, 2}, true), "a b");
  EXPECT_TRUE(t->is_special(20));
  EXPECT_FALSE(t->is_special(21));
  EXPECT_EQ(t->vocab_size(), 22);
  EXPECT_EQ(t->token_to_id("<x>"), 20);
  EXPECT_EQ(t->id_to_token(4), "ab");
}

TEST(AddedTokens, NormalizedTokenMatchesNormalizedText) {
  auto t = make({{"normalizer", {{"type", "Lowercase"}}},
                 {"added_tokens", {added("AB", 30, false, {{"normalized", true}})}}});
  EXPECT_EQ(t->encode("cAb"), (Ids{3, 30}));
}

TEST(PostProcessor, TemplateWithBosAndEos) {
  json tp = {{"type", "TemplateProcessing"},
             {"single",
              {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
               {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
               {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
             {"pair", json::array()},
             {"special_tokens",
              {{"<s>", {{"id", "<s>"}, {"ids", {40}}, {"tokens", {"<s>"}}}},
               {"</s>", {{"id", "</s>"}, {"ids", {41}}, {"tokens", {"</s>"}}}}}}};
  auto t = make({{"post_processor", tp},
                 {"added_tokens", {added("<s>", 40, true), added("</s>", 41, true)}}});
  EXPECT_EQ(t->encode("ab"), (Ids{40, 4, 41}));
  EXPECT_EQ(t->encode("ab", false), (Ids{4}));
}

TEST(Metaspace, PrependSplitAndDecode) {
  auto t = make(
      {{"pre_tokenizer",
        {{"type", "Metaspace"},
         {"replacement", "\xE2\x96\x81"},
         {"prepend_scheme", "first"},
         {"split", true}}},
       {"decoder",
        {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "first"}}}});
  EXPECT_EQ(t->encode("a b"), (Ids{8, 7, 2}));  // "▁a▁b" -> "▁a" "▁b"
  EXPECT_EQ(t->decode(Ids{8, 7, 2}), "a b");
}

TEST(Decoders, ByteFallbackReplacesInvalidRunsPerByte) {
  auto t =
      make({{"decoder",
             {{"type", "Sequence"},
              {"decoders",
               {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                {{"type", "ByteFallback"}},
                {{"type", "Fuse"}},
                {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}}});
  EXPECT_EQ(t->decode(Ids{9, 10}), "\xC3\xA9");
  EXPECT_EQ(t->decode(Ids{9, 1}),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(t->decode(Ids{9, 9}), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(t->decode(Ids{7, 2, 7, 1}), "b a");  // leading space stripped once

  IncrementalDetokenizer d(*t, true);
  EXPECT_EQ(d.push(1), "a");
  EXPECT_EQ(d.push(9), "");           // half of é is held back
  EXPECT_EQ(d.push(10), "");          // a later byte could still invalidate the run
  EXPECT_EQ(d.push(7), "\xC3\xA9 ");  // not the first token: its space survives Strip
  EXPECT_EQ(d.push(2), "b");
  EXPECT_EQ(d.finish(), "");
  EXPECT_EQ(t->decode(Ids{1, 9, 10, 7, 2}), "a\xC3\xA9 b");
  // ... as here, where the whole run becomes U+FFFD once it cannot be valid.
  IncrementalDetokenizer d2(*t, true);
  EXPECT_EQ(d2.push(9), "");
  EXPECT_EQ(d2.push(10), "");
  EXPECT_EQ(d2.push(10), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(d2.push(10), "\xEF\xBF\xBD");
  EXPECT_EQ(d2.finish(), "");
  EXPECT_EQ(t->decode(Ids{9, 10, 10, 10}), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_THROW(t->decode(Ids{99}), InvalidArgument);
}

std::vector<std::string> pre(const json& c, const std::string& s) {
  std::vector<std::string> w{s};
  make_pre_tokenizer(c)->pre_tokenize(w, true);
  return w;
}

TEST(PreTokenizers, SplitBehaviorsMatchHfDocs) {
  using V = std::vector<std::string>;
  auto split = [](const char* b) {
    return json{
        {"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", b}, {"invert", false}};
  };
  const std::string s = "the-final--countdown";
  EXPECT_EQ(pre(split("Removed"), s), (V{"the", "final", "countdown"}));
  EXPECT_EQ(pre(split("Isolated"), s), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(pre(split("MergedWithPrevious"), s), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(pre(split("MergedWithNext"), s), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(pre(split("Contiguous"), s), (V{"the", "-", "final", "--", "countdown"}));
  const json ws = {{"type", "Split"},
                   {"pattern", {{"Regex", "\\s+(?!\\S)|\\s+"}}},
                   {"behavior", "Isolated"},
                   {"invert", false}};
  EXPECT_EQ(pre(ws, "a   b"), (V{"a", "  ", " ", "b"}));
  EXPECT_EQ(pre({{"type", "Digits"}, {"individual_digits", true}}, "ab123c"),
            (V{"ab", "1", "2", "3", "c"}));
  EXPECT_EQ(pre({{"type", "Digits"}, {"individual_digits", false}}, "ab123c"),
            (V{"ab", "123", "c"}));
  EXPECT_EQ(
      pre({{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", false}}, "hi there"),
      (V{"\xC4\xA0hi\xC4\xA0there"}));
}

TEST(Normalizers, NfkcAndSequence) {
  EXPECT_EQ(make_normalizer({{"type", "NFKC"}})->normalize("\xEF\xAC\x81\xE2\x91\xA0"), "fi1");
  EXPECT_EQ(make_normalizer({{"type", "NFC"}})->normalize("e\xCC\x81"), "\xC3\xA9");
  const json seq = {{"type", "Sequence"},
                    {"normalizers",
                     {{{"type", "Prepend"}, {"prepend", "_"}},
                      {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "_"}}}}};
  EXPECT_EQ(make_normalizer(seq)->normalize("a b"), "_a_b");
  EXPECT_EQ(make_normalizer(seq)->normalize(""), "");
}

TEST(Errors, InvalidUtf8NamesOffsetAndBadJsonIsLoadError) {
  auto t = make(json::object());
  try {
    t->encode("ab\xC3(");
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("byte offset 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(t->encode("\xED\xA0\x80"), InvalidArgument);  // surrogate
  EXPECT_THROW(t->encode("\xC0\xAF"), InvalidArgument);      // overlong
  EXPECT_THROW(Tokenizer::from_json("{", ""), LoadError);
  json m = tiny_model();
  m["merges"].push_back("a zz");
  EXPECT_THROW(make({{"model", m}}), LoadError);
  EXPECT_THROW(Tokenizer::load("/nonexistent-dir"), LoadError);
}

TEST(Config, TokensAndChatTemplateForms) {
  auto t = make(
      {{"added_tokens", {added("<s>", 40, true), added("</s>", 41, true)}}},
      {{"bos_token", {{"content", "<s>"}}},
       {"eos_token", "</s>"},
       {"chat_template",
        {{{"name", "tool_use"}, {"template", "X"}}, {{"name", "default"}, {"template", "Y"}}}}});
  EXPECT_EQ(t->bos_token(), "<s>");
  EXPECT_EQ(t->eos_token(), "</s>");
  EXPECT_EQ(t->eos_token_id(), 41);
  EXPECT_EQ(t->chat_template_source(), "Y");
  auto bare = make(json::object());
  EXPECT_EQ(bare->eos_token(), "");
  EXPECT_FALSE(bare->eos_token_id().has_value());
  EXPECT_EQ(bare->chat_template_source(), "");
}

}  // namespace
}  // namespace serval::tokenizer
