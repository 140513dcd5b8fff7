// arbor::jinja::Template: lex + parse at construction, render with a fresh interpreter per call.
#include "text/jinja/template.h"

#include "text/jinja/lexer.h"
#include "text/jinja/parser.h"

namespace arbor::jinja {

Template Template::parse(const std::string& source, const std::string& name) {
  Template t;
  t.name_ = name;
  t.body_ = std::make_shared<const Body>(jinja::parse(lex(source, name), name));
  return t;
}

std::string Template::render(const std::vector<std::pair<std::string, Value>>& vars) const {
  auto globals = std::make_shared<Frame>();
  add_globals(*globals);
  for (const auto& [k, v] : vars) globals->set(k, v);
  Interpreter in(name_, limits_);
  return in.render(*body_, globals);
}

template <typename J>
static std::vector<std::pair<std::string, Value>> context_vars(const J& context, const std::string& name) {
  if (!context.is_object() && !context.is_null())
    throw TemplateError("runtime", name, 1, 1, "the render context must be a JSON object");
  std::vector<std::pair<std::string, Value>> vars;
  if (context.is_object())
    for (auto it = context.begin(); it != context.end(); ++it) vars.emplace_back(it.key(), from_json(it.value()));
  return vars;
}

std::string Template::render(const json& context) const { return render(context_vars(context, name_)); }
std::string Template::render(const nlohmann::ordered_json& context) const { return render(context_vars(context, name_)); }

}  // namespace arbor::jinja
