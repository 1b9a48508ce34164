// `serve --chat-template VALUE`: a file's contents, or VALUE itself when it is a template.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "base/error.h"
#include "tokenizer/chat_template.h"

namespace serval::tokenizer {
namespace {

namespace fs = std::filesystem;

// A fresh temporary folder per test, removed at the end.
class ChatTemplateArg : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("serval_chat_template_arg_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) const {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
  fs::path dir_;
};

TEST_F(ChatTemplateArg, ReadsTheFileItNames) {
  const std::string text = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}";
  EXPECT_EQ(chat_template_from_arg(write("t.jinja", text)), text);
}

TEST_F(ChatTemplateArg, TakesATemplateGivenInline) {
  EXPECT_EQ(chat_template_from_arg("{{ messages[0].content }}"), "{{ messages[0].content }}");
  EXPECT_EQ(chat_template_from_arg("plain\nline"), "plain\nline");
}

TEST_F(ChatTemplateArg, RejectsWhatIsNeither) {
  const std::string missing = (dir_ / "missing.jinja").string();
  try {
    chat_template_from_arg(missing);
    FAIL() << "a path that does not exist was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  EXPECT_THROW(chat_template_from_arg(dir_.string()), InvalidArgument);  // a folder
  EXPECT_THROW(chat_template_from_arg(write("empty.jinja", "")), InvalidArgument);
  EXPECT_THROW(chat_template_from_arg(""), InvalidArgument);
}

TEST_F(ChatTemplateArg, TheResultRenders) {
  const ChatTemplate t(chat_template_from_arg(
      write("t.jinja",
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")));
  const nlohmann::ordered_json messages = {{{"role", "user"}, {"content", "hi"}}};
  EXPECT_EQ(t.render(messages, true, nullptr, "", ""), "<user>hi<assistant>");
}

}  // namespace
}  // namespace serval::tokenizer
