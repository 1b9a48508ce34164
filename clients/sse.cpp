#include "clients/sse.h"

namespace serval::clients {

void SseParser::feed(std::string_view bytes, const OnData& on_data) {
  for (char c : bytes) {
    if (pending_cr_) {
      pending_cr_ = false;
      if (c == '\n') continue;  // second half of "\r\n": the line was already ended
    }
    if (c == '\r' || c == '\n') {
      pending_cr_ = (c == '\r');
      std::string line = std::move(line_);
      line_.clear();
      process_line(line, on_data);
    } else {
      line_.push_back(c);
    }
  }
}

void SseParser::process_line(std::string_view line, const OnData& on_data) {
  if (line.empty()) {  // blank line: dispatch
    if (has_data_) on_data(data_);
    data_.clear();
    has_data_ = false;
    return;
  }
  if (line.front() == ':') return;  // comment
  std::string_view field = line, value;
  if (auto colon = line.find(':'); colon != std::string_view::npos) {
    field = line.substr(0, colon);
    value = line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  if (field != "data") return;
  if (has_data_) data_.push_back('\n');
  data_.append(value);
  has_data_ = true;
}

}  // namespace serval::clients
