// Logging to stderr and a progress line for long loads (drawn only on a terminal).
#pragma once
#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace arbor {

void log_line(const std::string& s);  // one line to stderr
template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  log_line(fmt::format(f, std::forward<Args>(args)...));
}

// Progress: "loading weights  42% 3.1/7.4 GB 1.2 GB/s" redrawn in place on a TTY, silent otherwise.
class Progress {
 public:
  Progress(std::string label, uint64_t total);
  ~Progress();
  void advance(uint64_t n);
  void finish();

 private:
  std::string label_;
  uint64_t total_, done_ = 0;
  bool tty_, finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace arbor
