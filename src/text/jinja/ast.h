// Jinja AST: expression and statement nodes produced by the parser and walked by the interpreter.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/value.h"

namespace arbor::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class ExprKind {
  Const,     // value
  Name,      // name
  List,      // args
  Tuple,     // args
  Dict,      // args = k0, v0, k1, v1, ...
  GetAttr,   // a = object, name = attribute
  GetItem,   // a = object, b = key
  Slice,     // a = object, args = {start, stop, step} (null when omitted)
  Call,      // a = callee, args, kwargs
  Filter,    // a = operand (null inside a filter block), name, args, kwargs
  Test,      // a = operand, name, args, kwargs
  Unary,     // name = "-", "+", "not"; a
  Binary,    // name = "+", "-", "*", "/", "//", "%", "**", "~", "and", "or"; a, b
  Compare,   // a = first operand, args = rest, ops
  CondExpr,  // a = then, b = condition, c = else (may be null)
};

struct Expr {
  ExprKind kind;
  int line = 0, col = 0;
  Value value;
  std::string name;
  ExprPtr a, b, c;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

enum class StmtKind {
  Output,      // text
  Print,       // expr
  If,          // branches (cond, body); else_body
  For,         // target, expr = iterable, cond (filter), body, else_body
  Set,         // target, expr
  SetBlock,    // target, filter (optional, a Filter chain with a null innermost operand), body
  Macro,       // name, params, body
  CallBlock,   // expr = call, params (caller's), body
  FilterBlock, // filter, body
  With,        // targets + values as params-like pairs (name, value expr), body
  Break,
  Continue,
  Generation,  // body (transformers' {% generation %}: rendered as is)
};

struct Param {
  std::string name;
  ExprPtr default_value;  // null when none
};

struct Stmt {
  StmtKind kind;
  int line = 0, col = 0;
  std::string text;
  ExprPtr expr, target, cond, filter;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::string name;
  std::vector<Param> params;
  std::vector<std::pair<ExprPtr, ExprPtr>> assigns;  // with-statement targets and values
  bool recursive = false;
};

}  // namespace arbor::jinja
