// Jinja parser (see parser.h): a recursive-descent port of jinja2/parser.py's grammar.
#include "text/jinja/parser.h"

#include <cstdlib>
#include <set>

#include "text/jinja/error.h"
#include "text/jinja/pystr.h"

namespace arbor::jinja {
namespace {

class Parser {
 public:
  Parser(const std::vector<Token>& toks, const std::string& name, int max_depth)
      : t_(toks), name_(name), max_depth_(max_depth) {}

  Body parse_template() {
    Body body = subparse({});
    if (cur().type != Tok::Eof) fail_at(cur(), fmt::format("unexpected '{}'", cur().text));
    return body;
  }

 private:
  struct DepthGuard {
    Parser& p;
    DepthGuard(Parser& parser, const Token& at) : p(parser) {
      if (++p.depth_ > p.max_depth_) p.fail_at(at, fmt::format("template nesting deeper than {} levels", p.max_depth_));
    }
    ~DepthGuard() { --p.depth_; }
  };
  // Left-associative chains (a + b + c ..., x.a.b ..., x|f|g ...) deepen the AST without recursing in the
  // parser: each link counts as a level so that evaluating and freeing the tree stays within the stack.
  struct ChainGuard {
    Parser& p;
    int links = 0;
    explicit ChainGuard(Parser& parser) : p(parser) {}
    void link(const Token& at) {
      if (++p.depth_ > p.max_depth_) p.fail_at(at, fmt::format("template nesting deeper than {} levels", p.max_depth_));
      ++links;
    }
    ~ChainGuard() { p.depth_ -= links; }
  };

  const Token& cur() const { return t_[pos_]; }
  const Token& look(size_t k = 1) const { return t_[std::min(pos_ + k, t_.size() - 1)]; }
  const Token& next() {
    const Token& tk = t_[pos_];
    if (pos_ + 1 < t_.size()) ++pos_;
    return tk;
  }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }

  static std::string describe(const Token& tk) {
    switch (tk.type) {
      case Tok::Eof: return "end of template";
      case Tok::VarEnd: return "end of print statement";
      case Tok::BlockEnd: return "end of statement block";
      case Tok::VarBegin: return "begin of print statement";
      case Tok::BlockBegin: return "begin of statement block";
      case Tok::String: return py::repr_string(tk.text);
      default: return tk.text;
    }
  }

  [[noreturn]] void fail_at(const Token& tk, const std::string& msg) {
    throw TemplateError("syntax", name_, tk.line, tk.col, msg);
  }

  void expect_op(const char* op) {
    if (!skip_op(op)) fail_at(cur(), fmt::format("expected token '{}', got '{}'", op, describe(cur())));
  }
  const Token& expect_name() {
    if (cur().type != Tok::Name) fail_at(cur(), fmt::format("expected token 'name', got '{}'", describe(cur())));
    return next();
  }
  void expect_name(const char* n) {
    if (!skip_name(n)) fail_at(cur(), fmt::format("expected token '{}', got '{}'", n, describe(cur())));
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) fail_at(cur(), fmt::format("expected token 'end of statement block', got '{}'", describe(cur())));
    next();
  }

  ExprPtr make(ExprKind k, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = k, e->line = at.line, e->col = at.col;
    return e;
  }
  StmtPtr make_stmt(StmtKind k, const Token& at) {
    auto s = std::make_unique<Stmt>();
    s->kind = k, s->line = at.line, s->col = at.col;
    return s;
  }

  // ---------------------------------------------------------------- statements

  // Parses until a block whose first name is one of end_names (left as the current token).
  Body subparse(const std::set<std::string>& end_names) {
    Body body;
    while (cur().type != Tok::Eof) {
      const Token& tk = cur();
      if (tk.type == Tok::Data) {
        auto s = make_stmt(StmtKind::Output, tk);
        s->text = tk.text;
        body.push_back(std::move(s));
        next();
      } else if (tk.type == Tok::VarBegin) {
        next();
        auto s = make_stmt(StmtKind::Print, tk);
        s->expr = parse_tuple(false, true, {});
        if (cur().type != Tok::VarEnd) fail_at(cur(), fmt::format("expected token 'end of print statement', got '{}'", describe(cur())));
        next();
        body.push_back(std::move(s));
      } else if (tk.type == Tok::BlockBegin) {
        next();
        if (cur().type == Tok::Name && end_names.count(cur().text)) return body;
        DepthGuard g(*this, tk);
        body.push_back(parse_statement());
        expect_block_end();
      } else {
        fail_at(tk, "internal parser error");
      }
    }
    return body;
  }

  Body parse_statements(const std::set<std::string>& end_names, bool drop_needle, const Token& start) {
    skip_op(":");
    expect_block_end();
    Body body = subparse(end_names);
    if (cur().type == Tok::Eof) {
      std::string expected;
      for (const auto& n : end_names) expected += (expected.empty() ? "'" : " or '") + n + "'";
      fail_at(cur(), fmt::format("Unexpected end of template. Jinja was looking for the following tags: {}. The innermost block that needs to be closed is '{}' (line {}).",
                                 expected, start.text, start.line));
    }
    if (drop_needle) next();
    return body;
  }

  StmtPtr parse_statement() {
    const Token& tk = cur();
    if (tk.type != Tok::Name) fail_at(tk, "tag name expected");
    const std::string& n = tk.text;
    if (n == "if") return parse_if();
    if (n == "for") return parse_for();
    if (n == "set") return parse_set();
    if (n == "macro") return parse_macro();
    if (n == "call") return parse_call_block();
    if (n == "filter") return parse_filter_block();
    if (n == "with") return parse_with();
    if (n == "break" || n == "continue") {
      next();
      if (loop_depth_ == 0) fail_at(tk, fmt::format("'{}' outside of a loop", n));  // Jinja: loopcontrols check
      return make_stmt(n == "break" ? StmtKind::Break : StmtKind::Continue, tk);
    }
    if (n == "generation") {
      next();
      auto s = make_stmt(StmtKind::Generation, tk);
      s->body = parse_statements({"endgeneration"}, true, tk);
      return s;
    }
    static const std::set<std::string> unsupported = {"block", "extends", "include", "import", "from", "autoescape", "do", "trans"};
    if (unsupported.count(n)) fail_at(tk, fmt::format("tag '{}' is not supported in chat templates", n));
    fail_at(tk, fmt::format("Encountered unknown tag '{}'.", n));
  }

  StmtPtr parse_if() {
    const Token& start = next();
    auto s = make_stmt(StmtKind::If, start);
    while (true) {
      ExprPtr cond = parse_tuple(false, false, {});
      Body body = parse_statements({"elif", "else", "endif"}, false, start);
      s->branches.emplace_back(std::move(cond), std::move(body));
      const Token& tk = next();
      if (tk.text == "elif") continue;
      if (tk.text == "else") s->else_body = parse_statements({"endif"}, true, start);
      break;
    }
    return s;
  }

  StmtPtr parse_for() {
    const Token& start = next();
    auto s = make_stmt(StmtKind::For, start);
    s->target = parse_assign_target(true, false, {"in"});
    expect_name("in");
    s->expr = parse_tuple(false, false, {"recursive"});
    if (skip_name("if")) s->cond = parse_expression(true);
    if (skip_name("recursive")) fail_at(start, "recursive for loops are not supported");
    ++loop_depth_;
    s->body = parse_statements({"endfor", "else"}, false, start);
    --loop_depth_;
    if (next().text == "else") s->else_body = parse_statements({"endfor"}, true, start);
    return s;
  }

  StmtPtr parse_set() {
    const Token& start = next();
    s_target_namespace_ = true;
    ExprPtr target = parse_assign_target(true, false, {});
    s_target_namespace_ = false;
    if (skip_op("=")) {
      auto s = make_stmt(StmtKind::Set, start);
      s->target = std::move(target);
      s->expr = parse_tuple(false, true, {});
      return s;
    }
    auto s = make_stmt(StmtKind::SetBlock, start);
    s->target = std::move(target);
    if (is_op("|")) s->filter = parse_filter(nullptr, false);
    s->body = parse_statements({"endset"}, true, start);
    return s;
  }

  void parse_signature(std::vector<Param>& params) {
    expect_op("(");
    bool defaults = false;
    while (!is_op(")")) {
      if (!params.empty()) expect_op(",");
      const Token& tk = expect_name();
      Param p{tk.text, nullptr};
      if (skip_op("=")) {
        p.default_value = parse_expression(true);
        defaults = true;
      } else if (defaults) {
        fail_at(tk, "non-default argument follows default argument");
      }
      params.push_back(std::move(p));
    }
    expect_op(")");
  }

  StmtPtr parse_macro() {
    const Token& start = next();
    auto s = make_stmt(StmtKind::Macro, start);
    s->name = expect_name().text;
    parse_signature(s->params);
    int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_statements({"endmacro"}, true, start);
    loop_depth_ = saved;
    return s;
  }

  StmtPtr parse_call_block() {
    const Token& start = next();
    auto s = make_stmt(StmtKind::CallBlock, start);
    if (is_op("(")) parse_signature(s->params);
    const Token& at = cur();
    s->expr = parse_expression(true);
    if (s->expr->kind != ExprKind::Call) fail_at(at, "expected call");
    int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_statements({"endcall"}, true, start);
    loop_depth_ = saved;
    return s;
  }

  StmtPtr parse_filter_block() {
    const Token& start = next();
    auto s = make_stmt(StmtKind::FilterBlock, start);
    s->filter = parse_filter(nullptr, true);
    s->body = parse_statements({"endfilter"}, true, start);
    return s;
  }

  StmtPtr parse_with() {
    const Token& start = next();
    auto s = make_stmt(StmtKind::With, start);
    while (cur().type != Tok::BlockEnd) {
      if (!s->assigns.empty()) expect_op(",");
      ExprPtr target = parse_assign_target(true, false, {});
      expect_op("=");
      s->assigns.emplace_back(std::move(target), parse_expression(true));
    }
    s->body = parse_statements({"endwith"}, true, start);
    return s;
  }

  // A name, a tuple of names, or (for set) namespace.attr.
  ExprPtr parse_assign_target(bool with_tuple, bool name_only, const std::set<std::string>& extra_end) {
    const Token& at = cur();
    if (s_target_namespace_ && cur().type == Tok::Name && look().type == Tok::Op && look().text == ".") {
      auto e = make(ExprKind::GetAttr, at);
      auto base = make(ExprKind::Name, at);
      base->name = next().text;
      next();  // '.'
      e->name = expect_name().text;
      e->a = std::move(base);
      return e;
    }
    ExprPtr target = name_only || !with_tuple ? parse_primary() : parse_tuple(true, true, extra_end);
    check_assignable(*target, at);
    return target;
  }

  void check_assignable(const Expr& e, const Token& at) {
    if (e.kind == ExprKind::Name) {
      if (e.name == "true" || e.name == "false" || e.name == "none" || e.name == "True" || e.name == "False" || e.name == "None")
        fail_at(at, fmt::format("can't assign to '{}'", e.name));
      return;
    }
    if (e.kind == ExprKind::Tuple) {
      for (const auto& x : e.args) check_assignable(*x, at);
      return;
    }
    fail_at(at, "can't assign to this expression");
  }

  // ---------------------------------------------------------------- expressions

  bool is_tuple_end(const std::set<std::string>& extra_end) const {
    if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || cur().type == Tok::Eof) return true;
    if (is_op(")")) return true;
    return cur().type == Tok::Name && extra_end.count(cur().text);
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, const std::set<std::string>& extra_end, bool explicit_parens = false) {
    const Token& at = cur();
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      args.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) fail_at(cur(), fmt::format("Expected an expression, got '{}'", describe(cur())));
    }
    auto e = make(ExprKind::Tuple, at);
    e->args = std::move(args);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard g(*this, cur());
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    const Token& at = cur();
    ExprPtr e = parse_or();
    ChainGuard chain(*this);
    while (skip_name("if")) {
      chain.link(at);
      auto c = make(ExprKind::CondExpr, at);
      c->b = parse_or();
      if (skip_name("else")) c->c = parse_condexpr();
      c->a = std::move(e);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, const Token& at) {
    auto e = make(ExprKind::Binary, at);
    e->name = op, e->a = std::move(l), e->b = std::move(r);
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr l = parse_and();
    ChainGuard chain(*this);
    while (is_name("or")) {
      const Token& at = next();
      chain.link(at);
      l = binary("or", std::move(l), parse_and(), at);
    }
    return l;
  }
  ExprPtr parse_and() {
    ExprPtr l = parse_not();
    ChainGuard chain(*this);
    while (is_name("and")) {
      const Token& at = next();
      chain.link(at);
      l = binary("and", std::move(l), parse_not(), at);
    }
    return l;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      const Token& at = next();
      DepthGuard g(*this, at);
      auto e = make(ExprKind::Unary, at);
      e->name = "not", e->a = parse_not();
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    const Token& at = cur();
    ExprPtr first = parse_math1();
    auto e = make(ExprKind::Compare, at);
    ChainGuard chain(*this);
    while (true) {
      chain.link(cur());
      if (cur().type == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
                                    cur().text == ">" || cur().text == ">=")) {
        e->ops.push_back(next().text);
      } else if (is_name("in")) {
        next();
        e->ops.push_back("in");
      } else if (is_name("not") && look().type == Tok::Name && look().text == "in") {
        next(), next();
        e->ops.push_back("notin");
      } else {
        break;
      }
      e->args.push_back(parse_math1());
    }
    if (e->ops.empty()) return first;
    e->a = std::move(first);
    return e;
  }
  ExprPtr parse_math1() {
    ExprPtr l = parse_concat();
    ChainGuard chain(*this);
    while (is_op("+") || is_op("-")) {
      const Token& at = next();
      chain.link(at);
      l = binary(at.text, std::move(l), parse_concat(), at);
    }
    return l;
  }
  ExprPtr parse_concat() {
    ExprPtr l = parse_math2();
    ChainGuard chain(*this);
    while (is_op("~")) {
      const Token& at = next();
      chain.link(at);
      l = binary("~", std::move(l), parse_math2(), at);
    }
    return l;
  }
  ExprPtr parse_math2() {
    ExprPtr l = parse_pow();
    ChainGuard chain(*this);
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& at = next();
      chain.link(at);
      l = binary(at.text, std::move(l), parse_pow(), at);
    }
    return l;
  }
  ExprPtr parse_pow() {
    ExprPtr l = parse_unary(true);
    ChainGuard chain(*this);
    while (is_op("**")) {
      const Token& at = next();
      chain.link(at);
      l = binary("**", std::move(l), parse_unary(true), at);
    }
    return l;
  }
  ExprPtr parse_unary(bool with_filter) {
    const Token& at = cur();
    DepthGuard g(*this, at);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      next();
      e = make(ExprKind::Unary, at);
      e->name = at.text, e->a = parse_unary(false);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& tk = cur();
    DepthGuard g(*this, tk);
    ExprPtr e;
    if (tk.type == Tok::Name) {
      next();
      if (tk.text == "true" || tk.text == "True" || tk.text == "false" || tk.text == "False") {
        e = make(ExprKind::Const, tk);
        e->value = Value(tk.text == "true" || tk.text == "True");
      } else if (tk.text == "none" || tk.text == "None") {
        e = make(ExprKind::Const, tk);
        e->value = Value::none();
      } else {
        e = make(ExprKind::Name, tk);
        e->name = tk.text;
      }
    } else if (tk.type == Tok::String) {
      std::string s;
      while (cur().type == Tok::String) s += next().text;
      e = make(ExprKind::Const, tk);
      e->value = Value(std::move(s));
    } else if (tk.type == Tok::Int) {
      next();
      e = make(ExprKind::Const, tk);
      e->value = Value(*py::parse_int(tk.text, 10));
    } else if (tk.type == Tok::Float) {
      next();
      e = make(ExprKind::Const, tk);
      e->value = Value(std::strtod(tk.text.c_str(), nullptr));
    } else if (is_op("(")) {
      next();
      e = parse_tuple(false, true, {}, true);
      expect_op(")");
    } else if (is_op("[")) {
      next();
      e = make(ExprKind::List, tk);
      while (!is_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("]")) break;
        e->args.push_back(parse_expression(true));
      }
      expect_op("]");
    } else if (is_op("{")) {
      next();
      e = make(ExprKind::Dict, tk);
      while (!is_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("}")) break;
        e->args.push_back(parse_expression(true));
        expect_op(":");
        e->args.push_back(parse_expression(true));
      }
      expect_op("}");
    } else {
      fail_at(tk, fmt::format("unexpected '{}'", describe(tk)));
    }
    return e;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    ChainGuard chain(*this);
    while (true) {
      chain.link(cur());
      if (is_op(".") || is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    ChainGuard chain(*this);
    while (true) {
      chain.link(cur());
      if (is_op("|")) {
        e = parse_filter(std::move(e), false);
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    const Token& tk = next();
    if (tk.text == ".") {
      const Token& attr = next();
      if (attr.type == Tok::Name) {
        auto e = make(ExprKind::GetAttr, tk);
        e->a = std::move(obj), e->name = attr.text;
        return e;
      }
      if (attr.type != Tok::Int) fail_at(attr, "expected name or number");
      auto e = make(ExprKind::GetItem, tk);
      e->a = std::move(obj);
      e->b = make(ExprKind::Const, attr);
      e->b->value = Value(*py::parse_int(attr.text, 10));
      return e;
    }
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    if (args.size() == 1 && args[0]->kind == ExprKind::Slice) {
      args[0]->a = std::move(obj);
      return std::move(args[0]);
    }
    auto e = make(ExprKind::GetItem, tk);
    e->a = std::move(obj);
    if (args.size() == 1) {
      e->b = std::move(args[0]);
    } else {
      e->b = make(ExprKind::Tuple, tk);
      e->b->args = std::move(args);
    }
    return e;
  }

  ExprPtr parse_subscribed() {
    const Token& at = cur();
    std::vector<ExprPtr> parts;
    if (is_op(":")) {
      next();
      parts.push_back(nullptr);
    } else {
      ExprPtr node = parse_expression(true);
      if (!is_op(":")) return node;
      next();
      parts.push_back(std::move(node));
    }
    if (is_op(":")) {
      parts.push_back(nullptr);
    } else if (!is_op("]") && !is_op(",")) {
      parts.push_back(parse_expression(true));
    } else {
      parts.push_back(nullptr);
    }
    if (is_op(":")) {
      next();
      parts.push_back(!is_op("]") && !is_op(",") ? parse_expression(true) : nullptr);
    } else {
      parts.push_back(nullptr);
    }
    auto e = make(ExprKind::Slice, at);
    e->args = std::move(parts);
    return e;
  }

  void parse_call_args(Expr& e) {
    const Token& open = cur();
    expect_op("(");
    bool require_comma = false;
    while (!is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*") || is_op("**")) {
        std::string star = next().text;
        for (const auto& kw : e.kwargs)
          if (kw.first == "**" || (star == "*" && kw.first == "*")) fail_at(open, "invalid syntax for function call expression");
        e.kwargs.emplace_back(star, parse_expression(true));
      } else if (cur().type == Tok::Name && look().type == Tok::Op && look().text == "=") {
        for (const auto& kw : e.kwargs)
          if (kw.first == "**") fail_at(open, "invalid syntax for function call expression");
        std::string key = next().text;
        next();
        e.kwargs.emplace_back(key, parse_expression(true));
      } else {
        if (!e.kwargs.empty()) fail_at(open, "invalid syntax for function call expression");
        e.args.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make(ExprKind::Call, cur());
    e->line = callee->line, e->col = callee->col;  // errors point at the callee, not at "("
    e->a = std::move(callee);
    parse_call_args(*e);
    return e;
  }

  ExprPtr parse_filter(ExprPtr operand, bool start_inline) {
    ChainGuard chain(*this);
    while (is_op("|") || start_inline) {
      chain.link(cur());
      if (!start_inline) next();
      start_inline = false;
      const Token& tk = expect_name();
      std::string name = tk.text;
      while (is_op(".")) {
        next();
        name += "." + expect_name().text;
      }
      if (!has_filter(name)) fail_at(tk, fmt::format("No filter named '{}'.", name));
      auto e = make(ExprKind::Filter, tk);
      e->name = name, e->a = std::move(operand);
      if (is_op("(")) parse_call_args(*e);
      operand = std::move(e);
    }
    return operand;
  }

  ExprPtr parse_test(ExprPtr operand) {
    const Token& is_tok = next();
    bool negated = skip_name("not");
    const Token& tk = expect_name();
    std::string name = tk.text;
    while (is_op(".")) {
      next();
      name += "." + expect_name().text;
    }
    if (!has_test(name)) fail_at(tk, fmt::format("No test named '{}'.", name));
    auto e = make(ExprKind::Test, tk);
    e->name = name, e->a = std::move(operand);
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((cur().type == Tok::Name || cur().type == Tok::String || cur().type == Tok::Int || cur().type == Tok::Float ||
                is_op("(") || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail_at(cur(), "You cannot chain multiple tests with is");
      e->args.push_back(parse_postfix(parse_primary()));
    }
    if (!negated) return e;
    auto n = make(ExprKind::Unary, is_tok);
    n->name = "not", n->a = std::move(e);
    return n;
  }

  const std::vector<Token>& t_;
  std::string name_;
  size_t pos_ = 0;
  int depth_ = 0;
  int max_depth_;
  int loop_depth_ = 0;
  bool s_target_namespace_ = false;
};

}  // namespace

Body parse(const std::vector<Token>& tokens, const std::string& name, int max_depth) {
  return Parser(tokens, name, max_depth).parse_template();
}

}  // namespace arbor::jinja
