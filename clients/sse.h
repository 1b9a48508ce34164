// Incremental parser of a Server-Sent Events byte stream (the `data:` payloads of each event).
#pragma once
#include <functional>
#include <string>
#include <string_view>

namespace serval::clients {

// Feed bytes as they arrive, split anywhere (even inside "\r\n"); each complete event
// (terminated by a blank line) with at least one `data:` line is delivered once, its data
// lines joined by '\n'. Lines end in "\n", "\r\n" or "\r". Comment lines (":...") and other
// fields (event, id, retry) are ignored. A trailing event without its blank line is dropped,
// as the SSE standard says.
class SseParser {
 public:
  using OnData = std::function<void(std::string_view data)>;

  void feed(std::string_view bytes, const OnData& on_data);

 private:
  void process_line(std::string_view line, const OnData& on_data);

  std::string line_;         // bytes of the current, unfinished line
  std::string data_;         // data of the current event so far
  bool has_data_ = false;    // the current event had a data line
  bool pending_cr_ = false;  // the last byte was '\r': a following '\n' belongs to it
};

}  // namespace serval::clients
