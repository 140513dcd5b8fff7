// Client JSON read with the limits a server needs. Nesting depth is bounded while parsing, before anything
// walks the value recursively (nlohmann's copies, dump() and comparisons recurse, as do schema compiling
// and chat-template rendering, so a body nested ~60,000 deep would overflow the stack); a number that
// overflows a double is named by its place in the document; parse errors are in plain words, without the
// JSON library's exception names.
#pragma once
#include <optional>
#include <string>
#include <string_view>

#include "core/json.h"

namespace arbor::server {

// Deepest nesting of arrays and objects accepted (JSON schemas and tool arguments stay far below it).
constexpr int kMaxJsonDepth = 128;

struct JsonReadError {
  enum class Kind { Syntax, TooDeep, NumberOverflow } kind = Kind::Syntax;
  std::string where;    // path of the offending value, e.g. "messages[0].content" ("" at the top)
  std::string message;  // what is wrong, naming `where` and the limit
};

// Parses text as json or nlohmann::ordered_json; nullopt (and *err filled) when it is not valid JSON, nests
// deeper than kMaxJsonDepth, or holds a number too large for a double.
template <class J>
std::optional<J> read_json(std::string_view text, JsonReadError* err);

}  // namespace arbor::server
