// JsonPrefixScanner: the incremental (byte by byte) JSON prefix validator shared by the server's tool-call
// streaming and the engine's constrained JSON decoding.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace arbor {

// Incremental JSON validator: consumes text byte by byte and says whether it is still a prefix of valid
// JSON (RFC 8259: strings with escapes, surrogate pairs and UTF-8 checked), reporting where values and
// object keys begin and end. Shared by the tool-call parser (server/chat_output) and constrained JSON
// decoding (engine/json_constraint).
class JsonPrefixScanner {
 public:
  struct Event {
    enum class Kind { Begin, End, Key } kind;
    int depth;  // containers open around the value (or key)
    size_t start, end;  // byte offsets; end is exclusive (End and Key only)
  };
  // multi: several top-level values separated by ';' (Llama 3.1's parallel calls).
  explicit JsonPrefixScanner(bool multi = false) : multi_(multi) {}
  // Consumes byte c at offset pos (offsets are the caller's). Returns false, with the state unchanged, when
  // c cannot continue valid JSON. Events are appended to ev.
  bool step(char c, size_t pos, std::vector<Event>& ev);
  // A complete top-level value has been read and nothing is open.
  bool done() const;
  // Text that, appended, closes the open token and every container at index >= depth of the stack (the
  // container a Begin event at `depth` opened), leaving valid JSON for that value.
  std::string closing(int depth) const;
  int depth() const { return int(stack_.size()); }
  // Inside a string (a key or a value): whitespace is content there.
  bool in_string() const { return lex_ == Lex::Str; }
  // Inside a string with no escape or UTF-8 character half read.
  bool in_plain_string() const { return lex_ == Lex::Str && esc_ == 0 && !want_low_ && utf8_need_ == 0; }

 private:
  enum class Exp { Value, ValueOrClose, KeyOrClose, Key, Colon, CommaOrClose, After };
  enum class Lex { None, Str, Num, Lit };
  enum class Num { Minus, Zero, Int, Dot, Frac, E, ESign, Exp };
  struct Frame {
    char kind;  // '{' or '['
    Exp exp;
    size_t start;
  };
  bool structural(char c, size_t pos, std::vector<Event>& ev);
  void value_end(size_t start, size_t end, std::vector<Event>& ev);
  Exp& exp() { return stack_.empty() ? top_ : stack_.back().exp; }

  bool multi_;
  std::vector<Frame> stack_;
  Exp top_ = Exp::Value;
  Lex lex_ = Lex::None;
  size_t lex_start_ = 0;
  bool key_ = false;     // the open string is an object key
  int esc_ = 0;          // 0: none, 1: after '\', 2..5: hex digits of \uXXXX read so far + 2
  unsigned u_ = 0;       // \u value being read
  bool want_low_ = false;  // a high surrogate was read; a \u low surrogate must follow
  int utf8_need_ = 0;    // continuation bytes still expected
  unsigned char utf8_lo_ = 0x80, utf8_hi_ = 0xBF;  // range of the next continuation byte
  Num num_ = Num::Int;
  const char* lit_ = nullptr;  // rest of true/false/null
};

}  // namespace arbor
