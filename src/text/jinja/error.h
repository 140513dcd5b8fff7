// Template errors: an arbor::Error that carries the template name, line and column.
#pragma once
#include <string>

#include "core/error.h"

namespace arbor::jinja {

class TemplateError : public arbor::Error {
 public:
  // kind: "syntax" (while parsing), "runtime" (while rendering), "raised" (raise_exception in the template).
  TemplateError(const std::string& kind, const std::string& name, int line, int col, const std::string& msg)
      : arbor::Error(fmt::format("jinja: {}:{}:{}: {}{}", name.empty() ? "<template>" : name, line, col,
                                 kind == "syntax" ? "syntax error: " : "", msg)),
        kind_(kind), line_(line), col_(col), message_(msg) {}
  const std::string& kind() const { return kind_; }
  int line() const { return line_; }
  int col() const { return col_; }
  const std::string& message() const { return message_; }  // without the location prefix

 private:
  std::string kind_;
  int line_, col_;
  std::string message_;
};

}  // namespace arbor::jinja
