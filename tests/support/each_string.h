// Exhaustive inputs for matcher tests: every string up to a length over an alphabet.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace serval::testing {

// Calls fn with every string of length <= max_len over `alphabet`, shortest first.
inline void each_string(const std::string& alphabet, size_t max_len,
                        const std::function<void(const std::string&)>& fn) {
  std::vector<std::string> layer = {""};
  for (size_t len = 0; len <= max_len; ++len) {
    std::vector<std::string> next;
    for (const std::string& s : layer) {
      fn(s);
      if (len < max_len)
        for (char c : alphabet) next.push_back(s + c);
    }
    layer = std::move(next);
  }
}

}  // namespace serval::testing
