#include "clients/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

#include "base/clock.h"

namespace serval::clients {

ProgressBar::ProgressBar(std::string label, int total, bool enabled)
    : label_(std::move(label)),
      total_(total),
      enabled_(enabled && isatty(fileno(stderr))),
      start_s_(now_seconds()) {}

ProgressBar::~ProgressBar() {
  if (drawn_) std::fputc('\n', stderr);
}

void ProgressBar::update(int done) {
  if (!enabled_ || done == last_done_) return;
  double now = now_seconds();
  // At most ~10 redraws a second, but always the final one.
  if (done != total_ && now - last_draw_s_ < 0.1) return;
  last_draw_s_ = now;
  last_done_ = done;
  constexpr int kBar = 30;
  int filled = total_ > 0 ? done * kBar / total_ : kBar;
  int pct = total_ > 0 ? done * 100 / total_ : 100;
  fmt::print(stderr, "\r{}: {:3d}%|{}{}| {}/{} [{:.1f}s]", label_, pct, std::string(filled, '#'),
             std::string(kBar - filled, ' '), done, total_, now - start_s_);
  std::fflush(stderr);
  drawn_ = true;
}

void ErrorLog::record(const std::string& message) {
  ++total_;
  if (counts_[message]++ == 0) fmt::print(stderr, "\nrequest failed: {}\n", message);
}

}  // namespace serval::clients
