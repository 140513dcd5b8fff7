// Jinja values: undefined/none/bool/int/float/string/list(tuple)/dict(insertion-ordered)/callable/namespace,
// with Python's str(), repr(), truthiness, equality and ordering, and conversion from/to JSON.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/json.h"

namespace arbor::jinja {

class Value;
class Interpreter;
using ValueList = std::vector<Value>;
struct Dict;
struct Callable;

// Arguments of a call: positional values, then keyword arguments in call order.
struct CallArgs {
  ValueList pos;
  std::vector<std::pair<std::string, Value>> kw;
};

// Lists and dicts nest at most this deep (deeper is an error, not a stack overflow).
constexpr int kMaxNesting = 512;

class Value {
 public:
  enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Callable, Namespace };

  Value() = default;  // undefined
  static Value undefined(std::string hint = {}) {
    Value v;
    v.str_ = std::move(hint);
    return v;
  }
  static Value none() { return Value(Kind::None); }
  Value(bool b) : kind_(Kind::Bool), int_(b) {}
  Value(int i) : kind_(Kind::Int), int_(i) {}
  Value(int64_t i) : kind_(Kind::Int), int_(i) {}
  Value(double f) : kind_(Kind::Float), float_(f) {}
  Value(std::string s) : kind_(Kind::String), str_(std::move(s)) {}
  Value(const char* s) : kind_(Kind::String), str_(s) {}
  static Value list(ValueList items, bool tuple = false);
  static Value dict(std::shared_ptr<Dict> d);
  static Value dict();  // empty
  static Value namespace_(std::shared_ptr<Dict> d);
  static Value callable(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }  // bools are not ints here; see is_integral
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool; }
  bool is_integral() const { return kind_ == Kind::Int || kind_ == Kind::Bool; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_tuple() const { return kind_ == Kind::List && tuple_; }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_namespace() const { return kind_ == Kind::Namespace; }
  bool is_callable() const { return kind_ == Kind::Callable; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }  // Int or Bool
  double as_double() const { return kind_ == Kind::Float ? float_ : double(int_); }
  const std::string& str() const { return str_; }  // String; for Undefined, the hint for errors
  const ValueList& items() const { return *list_; }
  const Dict& dict_ref() const { return *dict_; }
  Dict& dict_mut() const { return *dict_; }  // namespaces are mutable through `set ns.x`
  const std::shared_ptr<Dict>& dict_ptr() const { return dict_; }
  const Callable& fn() const { return *fn_; }

  bool truthy() const;
  std::string to_str() const;   // Python str(); undefined prints as ""
  std::string repr() const;     // Python repr()
  std::string type_name() const;  // Python type name: 'str', 'int', 'dict', 'NoneType', ...

 private:
  explicit Value(Kind k) : kind_(k) {}
  static uint16_t nested_depth(const ValueList& items);
  static uint16_t nested_depth(const Dict& d);

  Kind kind_ = Kind::Undefined;
  bool tuple_ = false;
  uint16_t depth_ = 0;  // container nesting, bounded by kMaxNesting so that nothing recurses without limit
  int64_t int_ = 0;
  double float_ = 0;
  std::string str_;
  std::shared_ptr<const ValueList> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Callable> fn_;
};

// An insertion-ordered dict; keys compare with Python's == (1 == 1.0 == True).
struct Dict {
  std::vector<std::pair<Value, Value>> entries;
  const Value* find(const Value& key) const;
  const Value* find(const std::string& key) const;
  void set(const Value& key, Value v);
};

struct Callable {
  std::string name;
  std::function<Value(Interpreter&, CallArgs&)> fn;
};

bool py_equal(const Value& a, const Value& b);
// Python ordering (<): numbers with numbers, strings with strings, sequences elementwise.
// Returns false and sets *ok = false for incomparable types.
bool py_less(const Value& a, const Value& b, bool* ok);

// Conversions between JSON and values: objects keep their key order when the json type does.
Value from_json(const json& j);
Value from_json(const nlohmann::ordered_json& j);

// json.dumps(x, ensure_ascii=False, indent, separators, sort_keys) as transformers' tojson filter.
// indent: empty = None; otherwise the indent string per level. Throws arbor::Error naming the type that
// JSON cannot hold (undefined, callables).
struct JsonDumpOptions {
  bool has_indent = false;
  std::string indent;
  std::string item_sep = ", ";  // Python's default separators depend on indent
  std::string key_sep = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
std::string to_json_string(const Value& v, const JsonDumpOptions& opt);

}  // namespace arbor::jinja
