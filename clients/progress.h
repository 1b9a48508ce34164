// Console feedback shared by the clients: a progress bar on stderr (TTY only) and a log that
// prints each distinct failure message once.
#pragma once
#include <map>
#include <string>

namespace serval::clients {

// Draws "label:  37%|#####     | 37/100 [12.3s]" on stderr, rewritten in place; does nothing
// unless enabled and stderr is a terminal.
class ProgressBar {
 public:
  ProgressBar(std::string label, int total, bool enabled);
  ~ProgressBar();  // ends the line if anything was drawn
  void update(int done);

 private:
  std::string label_;
  int total_;
  bool enabled_;
  bool drawn_ = false;
  double start_s_;
  double last_draw_s_ = -1;
  int last_done_ = -1;
};

// Counts failures by message; the first of each distinct message goes to stderr.
class ErrorLog {
 public:
  void record(const std::string& message);
  int total() const { return total_; }
  const std::map<std::string, int>& counts() const { return counts_; }

 private:
  std::map<std::string, int> counts_;
  int total_ = 0;
};

}  // namespace serval::clients
