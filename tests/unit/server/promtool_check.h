// Runs `promtool check metrics` on a /metrics page (skips when promtool is absent).
#pragma once
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace serval::server::testing {

// Exit 1 is a format error; 3 means lint notes only. The spec's names ("serval:...", like
// vLLM's "vllm:...") draw the colon note, which is the one note accepted here.
inline void expect_promtool_accepts(const std::string& page, const std::string& file_name) {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) GTEST_SKIP() << "no promtool";
  // Per process: test binaries running side by side must not share the file.
  const std::string path =
      ::testing::TempDir() + "/" + std::to_string(::getpid()) + "-" + file_name;
  std::ofstream(path) << page;
  FILE* p = ::popen(("promtool check metrics < " + path + " 2>&1; echo rc=$?").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string report;
  char line[512];
  while (std::fgets(line, sizeof(line), p)) report += line;
  ::pclose(p);
  EXPECT_TRUE(report.ends_with("rc=0\n") || report.ends_with("rc=3\n")) << report;
  size_t pos = 0, notes = 0, colon_notes = 0;
  while ((pos = report.find('\n', pos)) != std::string::npos) ++pos, ++notes;
  for (pos = 0; (pos = report.find("should not contain ':'", pos)) != std::string::npos; ++pos)
    ++colon_notes;
  EXPECT_EQ(colon_notes + 1, notes) << report;  // every line but "rc=" is a colon note
}

}  // namespace serval::server::testing
