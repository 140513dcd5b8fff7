// Jinja parser: tokens -> AST, following jinja2/parser.py's grammar and precedence.
#pragma once
#include <string>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/lexer.h"

namespace arbor::jinja {

// Throws TemplateError("syntax", ...) with line and column. Nesting deeper than max_depth
// (brackets, operators, blocks) is an error rather than a stack overflow.
Body parse(const std::vector<Token>& tokens, const std::string& name, int max_depth = 512);

// Names known to the interpreter; the parser rejects unknown filters and tests as Jinja2 does when it
// compiles a template.
bool has_filter(const std::string& name);
bool has_test(const std::string& name);

}  // namespace arbor::jinja
