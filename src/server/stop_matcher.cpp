// Stop-string matching with hold-back.
#include "server/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace serval::server {

StopMatcher::StopMatcher(std::vector<std::string> stops, bool include_stop)
    : include_stop_(include_stop) {
  for (auto& s : stops) {
    if (s.empty()) continue;
    max_len_ = std::max(max_len_, s.size());
    stops_.push_back(std::move(s));
  }
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  pending_.append(text);
  if (stops_.empty()) return std::exchange(pending_, {});
  size_t first = std::string::npos, length = 0;
  for (const auto& s : stops_) {
    const size_t at = pending_.find(s);
    if (at < first || (at == first && at != std::string::npos && s.size() > length)) {
      first = at;
      length = s.size();
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, include_stop_ ? first + length : first);
    pending_.clear();
    return out;
  }
  // Longest suffix of pending_ that is a proper prefix of some stop string.
  size_t hold = 0;
  for (size_t k = std::min(pending_.size(), max_len_ - 1); k > 0 && hold == 0; --k) {
    std::string_view tail = std::string_view(pending_).substr(pending_.size() - k);
    for (const auto& s : stops_)
      if (s.size() > k && std::string_view(s).substr(0, k) == tail) {
        hold = k;
        break;
      }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::flush() {
  if (stopped_) return {};
  return std::exchange(pending_, {});
}

}  // namespace serval::server
