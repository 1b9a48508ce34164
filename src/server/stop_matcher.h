// Finds stop strings in streamed text that arrives in pieces, across token boundaries.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace serval::server {

// Text that could be the start of a stop string is held back until it is known not to be one;
// everything after a matched stop string is dropped, and the stop string too unless
// `include_stop` (vLLM's include_stop_str_in_output). The stop found first in the text wins;
// of several starting there, the longest.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops, bool include_stop = false);

  // Appends newly decoded text; returns the text that is safe to emit now. Once a stop string
  // is found, stopped() turns true and the returned text ends right before it (right after it
  // with include_stop).
  std::string push(std::string_view text);
  // End of generation without a stop string: returns the held-back text.
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;  // non-empty strings only
  std::string pending_;             // held back: a suffix that is a prefix of some stop
  size_t max_len_ = 0;
  bool include_stop_ = false;
  bool stopped_ = false;
};

}  // namespace serval::server
