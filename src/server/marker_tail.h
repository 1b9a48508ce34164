// Streaming text parsers hold back a tail that may be the start of a marker they look for.
#pragma once
#include <algorithm>
#include <cstddef>
#include <string_view>

namespace serval::server {

// The length of the longest tail of `text` that is a proper prefix of `marker` (0 if none): the
// bytes a stream must hold back until it knows whether the marker follows.
inline size_t partial_marker_tail(std::string_view text, std::string_view marker) {
  for (size_t keep = std::min(text.size(), marker.size() - 1); keep > 0; --keep)
    if (text.substr(text.size() - keep) == marker.substr(0, keep)) return keep;
  return 0;
}

// How much of a stream's text may go out before `marker`: up to it, or, while it has not come,
// short of a tail that may begin it.
inline size_t text_before_marker(std::string_view text, std::string_view marker) {
  const size_t at = text.find(marker);
  return at != std::string_view::npos ? at : text.size() - partial_marker_tail(text, marker);
}

}  // namespace serval::server
