// Errors: every library error is an arbor::Error whose message names the component and the cause.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace arbor {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// fail("safetensors: {}: tensor '{}' ends at byte {}, file has {}", ...)
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace arbor

// ARBOR_CHECK(cond, "component: what went wrong {}", value): throws arbor::Error when cond is false.
#define ARBOR_CHECK(cond, ...)      \
  do {                              \
    if (!(cond)) ::arbor::fail(__VA_ARGS__); \
  } while (0)
