// How deeply a JSON text nests, found by a scan of its brackets (strings skipped), so that a
// text nested too deeply can be refused before a recursive parser or walker sees it.
#pragma once
#include <string_view>

namespace serval {

// The deepest nesting of [ and { in `text`, counting no further than `limit` + 1.
inline int json_nesting_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest && (deepest = depth) > limit) break;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace serval
