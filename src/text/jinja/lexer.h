// Jinja lexer: splits a template into data and tag tokens the way Jinja2's lexer does with
// trim_blocks=True and lstrip_blocks=True (newline normalisation, "-"/"+" markers, raw blocks, comments).
#pragma once
#include <string>
#include <vector>

namespace arbor::jinja {

enum class Tok { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type;
  std::string text;  // data text, name, decoded string literal, number text, or operator
  int line = 1, col = 1;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// Throws jinja::TemplateError (an arbor::Error) with the line and column of the bad input.
std::vector<Token> lex(const std::string& source, const std::string& name, const LexOptions& opt = {});

}  // namespace arbor::jinja
