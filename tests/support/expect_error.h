// Expecting an exception whose message names what went wrong.
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/error.h"

namespace serval::testing {

// Runs `f`, which must throw `E` (LoadError by default) whose message contains every needle.
template <class E = LoadError, class F>
void expect_error(F&& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "expected an exception mentioning '" << needles.at(0) << "'";
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const std::string& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "message '" << msg << "' lacks '" << n << "'";
  }
}

template <class F>
void expect_load_error(F&& f, const std::vector<std::string>& needles) {
  expect_error<LoadError>(std::forward<F>(f), needles);
}

}  // namespace serval::testing
