// GSM8K answer extraction and prompt building.
#include "clients/gsm8k.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "base/error.h"

using namespace serval::clients;

TEST(Gsm8kExtract, TrickyCompletions) {
  EXPECT_EQ(extract_answer("no digits here"), std::nullopt);
  EXPECT_EQ(extract_answer(""), std::nullopt);
  EXPECT_EQ(extract_answer("3 apples and 4 pears make 7"), "7");
  EXPECT_EQ(extract_answer("The total is 1,234."), "1234");
  EXPECT_EQ(extract_answer("costs $1,234,567 in all"), "1234567");
  EXPECT_EQ(extract_answer("18 then 3.75"), "75");  // digit runs, like vLLM's \d+
  EXPECT_EQ(extract_answer("answer: -5"), "5");
  EXPECT_EQ(extract_answer("x=12abc34"), "34");
  EXPECT_EQ(extract_answer("0"), "0");
  EXPECT_EQ(extract_answer("is 00"), "0");
  EXPECT_EQ(extract_answer("James 007"), std::nullopt);  // Python literal_eval rejects it
  EXPECT_EQ(extract_answer("12345678901234567890123"), "12345678901234567890123");
}

TEST(Gsm8kExtract, RealDatasetLabels) {
  std::string path = SERVAL_SHARED_DIR "/data/gsm8k/test.jsonl";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is absent";
  std::vector<Gsm8kItem> items = load_gsm8k(path);
  ASSERT_EQ(items.size(), 1319u);
  // Labels of the first items, read off the "#### N" lines by hand.
  EXPECT_EQ(extract_answer(items[0].answer), "18");
  EXPECT_EQ(extract_answer(items[1].answer), "3");
  EXPECT_EQ(extract_answer(items[2].answer), "70000");  // "#### 70000" after "$70,000"
  for (int i = 0; i < 50; ++i) {
    const std::string& a = items[i].answer;
    size_t mark = a.rfind("####");
    ASSERT_NE(mark, std::string::npos) << "item " << i;
    std::string tail = a.substr(mark + 4);
    std::string digits;
    for (char c : tail)
      if (c >= '0' && c <= '9') digits.push_back(c);
    EXPECT_EQ(extract_answer(a), digits) << "item " << i << ": " << tail;
  }
}

TEST(Gsm8kPrompt, FiveShotFormat) {
  std::vector<Gsm8kItem> train;
  for (int i = 0; i < 7; ++i)
    train.push_back(
        {"Q" + std::to_string(i) + "?", "A" + std::to_string(i) + "\n#### " + std::to_string(i)});
  std::string want =
      "Question: Q0?\nAnswer: A0\n#### 0\n\n"
      "Question: Q1?\nAnswer: A1\n#### 1\n\n"
      "Question: Q2?\nAnswer: A2\n#### 2\n\n"
      "Question: Q3?\nAnswer: A3\n#### 3\n\n"
      "Question: Q4?\nAnswer: A4\n#### 4\n\n"
      "Question: How many?\nAnswer:";
  EXPECT_EQ(build_prompt(train, 5, "How many?"), want);
  EXPECT_EQ(build_prompt(train, 0, "Hi"), "Question: Hi\nAnswer:");
  EXPECT_THROW(build_prompt(train, 8, "x"), serval::InvalidArgument);
}

TEST(Gsm8kData, RealTrainPromptStartsWithFirstItem) {
  std::string dir = SERVAL_SHARED_DIR "/data/gsm8k";
  if (!std::filesystem::exists(dir + "/train.jsonl")) GTEST_SKIP() << dir << " is absent";
  EXPECT_EQ(gsm8k_data_dir(dir), dir);
  auto train = load_gsm8k(dir + "/train.jsonl");
  std::string p = build_prompt(train, 5, "What?");
  EXPECT_EQ(p.rfind("Question: " + train[0].question + "\nAnswer: " + train[0].answer + "\n\n", 0),
            0u);
  EXPECT_TRUE(p.ends_with("\n\nQuestion: What?\nAnswer:"));
}

TEST(Gsm8kData, MissingDataDirSaysWhat) {
  try {
    gsm8k_data_dir("/nonexistent/gsm8k");
    FAIL() << "expected LoadError";
  } catch (const serval::LoadError& e) {
    EXPECT_NE(std::string(e.what()).find("train.jsonl is missing"), std::string::npos);
  }
}
