// stderr logging and terminal progress.
#include "core/log.h"

#include <unistd.h>

#include <cstdio>

namespace arbor {

void log_line(const std::string& s) {
  std::fputs(s.c_str(), stderr);
  std::fputc('\n', stderr);
}

Progress::Progress(std::string label, uint64_t total)
    : label_(std::move(label)), total_(total), tty_(::isatty(2)), start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

Progress::~Progress() { finish(); }

void Progress::advance(uint64_t n) {
  done_ += n;
  if (!tty_) return;
  auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < std::chrono::milliseconds(100) && done_ < total_) return;
  last_draw_ = now;
  double secs = std::chrono::duration<double>(now - start_).count();
  double gb = 1e-9 * double(done_);
  std::fprintf(stderr, "\r%s %3d%% %.2f/%.2f GB %.2f GB/s  ", label_.c_str(), total_ ? int(100 * done_ / total_) : 100, gb,
               1e-9 * double(total_), secs > 0 ? gb / secs : 0.0);
  std::fflush(stderr);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (tty_ && done_ > 0) std::fputs("\n", stderr);
}

}  // namespace arbor
