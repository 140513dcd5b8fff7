// arbor::jinja::Template: the public entry point of the Jinja engine. Parse once, render many times,
// with Jinja2's semantics as Hugging Face transformers configures it for chat templates
// (trim_blocks, lstrip_blocks, loop controls, raise_exception, strftime_now, its tojson filter).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/json.h"
#include "text/jinja/error.h"
#include "text/jinja/interpreter.h"
#include "text/jinja/value.h"

namespace arbor::jinja {

class Template {
 public:
  // Throws TemplateError (kind "syntax") with line and column on a malformed template.
  static Template parse(const std::string& source, const std::string& name = "<template>");

  // Renders with the top-level variables of `context` (a JSON object; key order is kept when it is
  // an ordered_json). Throws TemplateError (kind "runtime", or "raised" for raise_exception()).
  std::string render(const json& context) const;
  std::string render(const nlohmann::ordered_json& context) const;
  // Renders with variables given as values.
  std::string render(const std::vector<std::pair<std::string, Value>>& vars) const;

  void set_limits(const RenderLimits& limits) { limits_ = limits; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::shared_ptr<const Body> body_;
  RenderLimits limits_;
};

}  // namespace arbor::jinja
