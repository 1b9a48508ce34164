// `--reasoning-parser`: how an output splits into reasoning and content, when a reply starts in
// the reasoning block, and that a stream's parts are always prefixes of the finished split (so
// the streamed deltas add up to the non-streamed message).
#include "server/reasoning_parser.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace serval::server {
namespace {

constexpr ReasoningParser kR1 = ReasoningParser::kDeepSeekR1;
constexpr ReasoningParser kMistral = ReasoningParser::kMistral;

void expect_split(std::string_view text, bool in_reasoning, std::string_view reasoning,
                  std::string_view content) {
  const ReasoningParts p = split_reasoning(kR1, text, in_reasoning, /*finished=*/true);
  EXPECT_EQ(p.reasoning, reasoning) << text;
  EXPECT_EQ(p.content, content) << text;
}

TEST(ReasoningParser, Names) {
  EXPECT_EQ(reasoning_parser_from_name("qwen3"), ReasoningParser::kQwen3);
  EXPECT_EQ(reasoning_parser_from_name("deepseek_r1"), ReasoningParser::kDeepSeekR1);
  EXPECT_EQ(reasoning_parser_from_name("mistral"), ReasoningParser::kMistral);
  EXPECT_EQ(reasoning_parser_from_name("deepseek_v3"), ReasoningParser::kDeepSeekV3);
  EXPECT_FALSE(reasoning_parser_from_name("granite").has_value());
  EXPECT_FALSE(reasoning_parser_from_name("").has_value());
}

// qwen3 starts outside the block only when the request turns thinking off; deepseek_r1 always
// starts inside; no parser never does.
TEST(ReasoningParser, StartState) {
  EXPECT_TRUE(starts_in_reasoning(ReasoningParser::kQwen3, std::nullopt));
  EXPECT_TRUE(starts_in_reasoning(ReasoningParser::kQwen3, true));
  EXPECT_FALSE(starts_in_reasoning(ReasoningParser::kQwen3, false));
  EXPECT_TRUE(starts_in_reasoning(ReasoningParser::kDeepSeekR1, false));
  // deepseek_v3 (V3.1) thinks only when asked, by either key.
  EXPECT_FALSE(starts_in_reasoning(ReasoningParser::kDeepSeekV3, std::nullopt));
  EXPECT_TRUE(starts_in_reasoning(ReasoningParser::kDeepSeekV3, std::nullopt, true));
  EXPECT_TRUE(starts_in_reasoning(ReasoningParser::kDeepSeekV3, true));
  EXPECT_FALSE(starts_in_reasoning(ReasoningParser::kDeepSeekV3, false, false));
  EXPECT_FALSE(starts_in_reasoning(ReasoningParser::kNone, std::nullopt));
  EXPECT_FALSE(starts_in_reasoning(kMistral, std::nullopt));
  EXPECT_FALSE(starts_in_reasoning(kMistral, true));
  EXPECT_TRUE(reasoning_markers_are_special(kMistral));
  EXPECT_FALSE(reasoning_markers_are_special(ReasoningParser::kQwen3));
}

TEST(ReasoningParser, FinishedSplits) {
  // The model opens the block itself (Qwen3's first template) or the prompt did (R1 and later).
  expect_split("<think>\nplan\n</think>\n\nAnswer.", true, "\nplan\n", "\n\nAnswer.");
  expect_split("plan</think>Answer.", true, "plan", "Answer.");
  expect_split("</think>Answer.", true, "", "Answer.");
  expect_split("plan</think>", true, "plan", "");
  // Cut short while thinking: all of it is reasoning, a partial tag included.
  expect_split("<think>still thinking </thi", true, "still thinking </thi", "");
  expect_split("<thi", true, "<thi", "");
  // Only a leading <think> is a tag; a later one, and a second </think>, are text.
  expect_split(" <think>a</think>b</think>c", true, " <think>a", "b</think>c");
  // Thinking turned off: everything is content, tags too.
  expect_split("<think>a</think>b", false, "", "<think>a</think>b");
  expect_split("", true, "", "");
}

TEST(ReasoningParser, StreamHoldsBackPossibleTags) {
  EXPECT_EQ(split_reasoning(kR1, "<thi", true, false).reasoning, "");
  EXPECT_EQ(split_reasoning(kR1, "<think>ab</", true, false).reasoning, "ab");
  EXPECT_EQ(split_reasoning(kR1, "<think>ab</x", true, false).reasoning, "ab</x");
  EXPECT_EQ(split_reasoning(kR1, "ab<", true, false).reasoning, "ab");
  const ReasoningParts closed = split_reasoning(kR1, "ab</think>c</thi", true, false);
  EXPECT_EQ(closed.reasoning, "ab");
  EXPECT_EQ(closed.content, "c</thi");  // content holds nothing back
}

// Every prefix of random texts built from `pieces` (marker fragments) splits into prefixes of the
// finished split's parts, and the parts only grow: a stream never sends what it must take back.
void expect_stream_prefixes(ReasoningParser parser, const std::vector<std::string>& pieces,
                            bool in_reasoning, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 500; ++trial) {
    std::string text;
    const int n = 1 + int(rng() % 12);
    for (int i = 0; i < n; ++i) text += pieces[rng() % pieces.size()];
    const ReasoningParts full = split_reasoning(parser, text, in_reasoning, true);
    size_t sent_reasoning = 0, sent_content = 0;
    for (size_t len = 0; len <= text.size(); ++len) {
      const ReasoningParts p =
          split_reasoning(parser, std::string_view(text).substr(0, len), in_reasoning, false);
      ASSERT_TRUE(full.reasoning.starts_with(p.reasoning)) << text << " at " << len;
      ASSERT_TRUE(full.content.starts_with(p.content)) << text << " at " << len;
      ASSERT_GE(p.reasoning.size(), sent_reasoning) << text << " at " << len;
      ASSERT_GE(p.content.size(), sent_content) << text << " at " << len;
      sent_reasoning = p.reasoning.size();
      sent_content = p.content.size();
    }
  }
}

TEST(ReasoningParser, StreamPartsArePrefixesOfTheFinishedSplit) {
  const std::vector<std::string> pieces = {"<think>", "</think>", "<", "</", "</th", "<thi",
                                           "think>",  ">",        "a", "\n", "é",    "/"};
  expect_stream_prefixes(kR1, pieces, true, 20261207);
  expect_stream_prefixes(kR1, pieces, false, 20261207);
}

void expect_mistral(std::string_view text, std::string_view reasoning, std::string_view content) {
  const ReasoningParts p = split_reasoning(kMistral, text, false, /*finished=*/true);
  EXPECT_EQ(p.reasoning, reasoning) << text;
  EXPECT_EQ(p.content, content) << text;
}

TEST(ReasoningParser, MistralFinishedSplits) {
  expect_mistral("[THINK]plan[/THINK]Answer.", "plan", "Answer.");
  expect_mistral("[THINK][/THINK]Answer.", "", "Answer.");
  expect_mistral("Hi [THINK]plan[/THINK] there", "plan", "Hi  there");  // content around it
  expect_mistral("[THINK]cut short [/THI", "cut short [/THI", "");
  expect_mistral("no thinking at all", "", "no thinking at all");
  expect_mistral("stray[/THINK] close", "", "stray close");  // a close without an open: dropped
  expect_mistral("[THINK]a[/THINK]b[THINK]c[/THINK]", "a", "b[THINK]c[/THINK]");  // one block
  expect_mistral("<think>a</think>b", "", "<think>a</think>b");  // other models' tags are text
  expect_mistral("", "", "");
}

TEST(ReasoningParser, MistralStreamHoldsBackPossibleMarkers) {
  EXPECT_EQ(split_reasoning(kMistral, "ab[TH", false, false).content, "ab");
  EXPECT_EQ(split_reasoning(kMistral, "ab[/TH", false, false).content, "ab");
  EXPECT_EQ(split_reasoning(kMistral, "ab[x", false, false).content, "ab[x");
  const ReasoningParts open = split_reasoning(kMistral, "ab[THINK]cd[/", false, false);
  EXPECT_EQ(open.content, "ab");
  EXPECT_EQ(open.reasoning, "cd");
  const ReasoningParts closed = split_reasoning(kMistral, "ab[THINK]cd[/THINK]e[TH", false, false);
  EXPECT_EQ(closed.reasoning, "cd");
  EXPECT_EQ(closed.content, "abe[TH");  // after the block nothing is held back
}

TEST(ReasoningParser, MistralStreamPartsArePrefixesOfTheFinishedSplit) {
  expect_stream_prefixes(
      kMistral,
      {"[THINK]", "[/THINK]", "[", "[/", "[/TH", "[THI", "INK]", "]", "a", "\n", "é", "/"}, false,
      20261208);
}

}  // namespace
}  // namespace serval::server
