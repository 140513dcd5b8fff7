// ApiError: an error the HTTP layer turns into an OpenAI-style error object with the right status.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace arbor::server {

struct ApiError : std::runtime_error {
  int status;
  std::string type, param, code;
  ApiError(int status, std::string message, std::string param = {}, std::string code = {},
           std::string type = "invalid_request_error")
      : std::runtime_error(std::move(message)), status(status), type(std::move(type)), param(std::move(param)), code(std::move(code)) {}
};

// bad_request("temperature", "must be between 0 and 2, got {}", t)
template <typename... Args>
[[noreturn]] void bad_request(const std::string& param, fmt::format_string<Args...> f, Args&&... args) {
  std::string msg = fmt::format(f, std::forward<Args>(args)...);
  throw ApiError(400, param.empty() ? msg : fmt::format("'{}' {}", param, msg), param);
}

}  // namespace arbor::server
