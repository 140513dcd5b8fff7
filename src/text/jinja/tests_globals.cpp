// Jinja tests (`x is defined`, ...), the global functions transformers' environment provides
// (range, dict, namespace, joiner, raise_exception, strftime_now), and argument helpers for builtins.
#include <cmath>
#include <ctime>
#include <map>

#include "text/jinja/interpreter.h"
#include "text/jinja/pystr.h"

namespace arbor::jinja {

const Value* find_arg(const CallArgs& a, size_t index, const char* name) {
  if (index < a.pos.size()) return &a.pos[index];
  for (const auto& [k, v] : a.kw)
    if (k == name) return &v;
  return nullptr;
}

Value arg_or(const CallArgs& a, size_t index, const char* name, Value def) {
  const Value* v = find_arg(a, index, name);
  return v ? *v : std::move(def);
}

void check_args(const CallArgs& a, const char* fn, size_t max_pos, std::initializer_list<const char*> names) {
  if (a.pos.size() > max_pos) fail("{}() takes at most {} argument(s), {} given", fn, max_pos, a.pos.size());
  for (const auto& [k, v] : a.kw) {
    bool known = false;
    size_t i = 0;
    for (const char* n : names) {
      if (k == n) {
        known = true;
        if (i < a.pos.size()) fail("{}() got multiple values for argument '{}'", fn, k);
      }
      ++i;
    }
    if (!known) fail("{}() got an unexpected keyword argument '{}'", fn, k);
  }
}

namespace {

using Args = CallArgs;

Value other(const Args& a, const char* test) {
  if (a.pos.empty()) fail("test '{}' needs an argument", test);
  return a.pos[0];
}

bool ordered(const Value& x, const Value& y, const char* op) {
  if (x.is_undefined() || y.is_undefined()) fail("{}", (x.is_undefined() ? x : y).str());
  bool ok;
  bool r = py_less(x, y, &ok);
  if (!ok) fail("'{}' not supported between instances of '{}' and '{}'", op, x.type_name(), y.type_name());
  return r;
}

int64_t mod2(const Value& v) {
  if (v.is_undefined()) fail("{}", v.str());
  if (v.is_integral()) return ((v.as_int() % 2) + 2) % 2;
  if (v.is_float()) return std::fmod(std::fabs(v.as_double()), 2.0) == 1.0 ? 1 : (std::fmod(v.as_double(), 2.0) == 0 ? 0 : -1);
  fail("unsupported operand type(s) for %: '{}' and 'int'", v.type_name());
}

bool t_defined(Interpreter&, const Value& v, Args&) { return !v.is_undefined(); }
bool t_undefined(Interpreter&, const Value& v, Args&) { return v.is_undefined(); }
bool t_none(Interpreter&, const Value& v, Args&) { return v.is_none(); }
bool t_boolean(Interpreter&, const Value& v, Args&) { return v.is_bool(); }
bool t_true(Interpreter&, const Value& v, Args&) { return v.is_bool() && v.as_bool(); }
bool t_false(Interpreter&, const Value& v, Args&) { return v.is_bool() && !v.as_bool(); }
bool t_integer(Interpreter&, const Value& v, Args&) { return v.is_int(); }
bool t_float(Interpreter&, const Value& v, Args&) { return v.is_float(); }
bool t_number(Interpreter&, const Value& v, Args&) { return v.is_number(); }
bool t_string(Interpreter&, const Value& v, Args&) { return v.is_string(); }
bool t_mapping(Interpreter&, const Value& v, Args&) { return v.is_dict(); }
bool t_iterable(Interpreter&, const Value& v, Args&) { return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined(); }
bool t_sequence(Interpreter&, const Value& v, Args&) { return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined(); }
bool t_callable(Interpreter&, const Value& v, Args&) { return v.is_callable(); }
bool t_eq(Interpreter&, const Value& v, Args& a) { return py_equal(v, other(a, "eq")); }
bool t_ne(Interpreter&, const Value& v, Args& a) { return !py_equal(v, other(a, "ne")); }
bool t_lt(Interpreter&, const Value& v, Args& a) { return ordered(v, other(a, "lt"), "<"); }
bool t_gt(Interpreter&, const Value& v, Args& a) { return ordered(other(a, "gt"), v, ">"); }
bool t_le(Interpreter&, const Value& v, Args& a) { return !ordered(other(a, "le"), v, "<="); }
bool t_ge(Interpreter&, const Value& v, Args& a) { return !ordered(v, other(a, "ge"), ">="); }
bool t_in(Interpreter&, const Value& v, Args& a) {
  Value seq = other(a, "in");
  if (seq.is_undefined()) return false;
  if (!(seq.is_list() || seq.is_dict() || seq.is_string())) fail("argument of type '{}' is not iterable", seq.type_name());
  if (seq.is_string() && !v.is_string()) fail("'in <string>' requires string as left operand, not {}", v.type_name());
  return contains(seq, v);
}
bool t_odd(Interpreter&, const Value& v, Args&) { return mod2(v) == 1; }
bool t_even(Interpreter&, const Value& v, Args&) { return mod2(v) == 0; }
bool t_divisibleby(Interpreter& in, const Value& v, Args& a) {
  Value r = binary_op("%", v, other(a, "divisibleby"), in);
  return r.as_double() == 0;
}
bool t_sameas(Interpreter&, const Value& v, Args& a) {
  Value o = other(a, "sameas");
  if (v.kind() != o.kind()) return false;
  if (v.is_none() || v.is_undefined()) return true;
  if (v.is_bool() || v.is_int()) return v.as_int() == o.as_int();
  if (v.is_list()) return &v.items() == &o.items();
  if (v.is_dict() || v.is_namespace()) return v.dict_ptr() == o.dict_ptr();
  return false;  // strings and floats: distinct objects in general
}
bool t_lower(Interpreter&, const Value& v, Args&) {
  if (!v.is_string()) return false;
  bool cased = false;
  for (uint32_t c : py::decode(v.str())) {
    if (py::is_upper(c)) return false;
    cased = cased || py::is_lower(c);
  }
  return cased;
}
bool t_upper(Interpreter&, const Value& v, Args&) {
  if (!v.is_string()) return false;
  bool cased = false;
  for (uint32_t c : py::decode(v.str())) {
    if (py::is_lower(c)) return false;
    cased = cased || py::is_upper(c);
  }
  return cased;
}
bool t_escaped(Interpreter&, const Value&, Args&) { return false; }
bool t_filter(Interpreter&, const Value& v, Args&) { return v.is_string() && find_filter(v.str()); }
bool t_test(Interpreter&, const Value& v, Args&) { return v.is_string() && find_test(v.str()); }

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> m = {
      {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none},       {"boolean", t_boolean},
      {"true", t_true},       {"false", t_false},         {"integer", t_integer}, {"float", t_float},
      {"number", t_number},   {"string", t_string},       {"mapping", t_mapping}, {"iterable", t_iterable},
      {"sequence", t_sequence}, {"callable", t_callable}, {"eq", t_eq},           {"equalto", t_eq},
      {"==", t_eq},           {"ne", t_ne},               {"!=", t_ne},           {"lt", t_lt},
      {"lessthan", t_lt},     {"<", t_lt},                {"le", t_le},           {"<=", t_le},
      {"gt", t_gt},           {"greaterthan", t_gt},      {">", t_gt},            {"ge", t_ge},
      {">=", t_ge},           {"in", t_in},               {"odd", t_odd},         {"even", t_even},
      {"divisibleby", t_divisibleby}, {"sameas", t_sameas}, {"lower", t_lower},   {"upper", t_upper},
      {"escaped", t_escaped}, {"filter", t_filter},       {"test", t_test},
  };
  return m;
}

std::shared_ptr<Dict> dict_from_args(const Args& a, const char* fn) {
  auto d = std::make_shared<Dict>();
  if (a.pos.size() > 1) fail("{} expected at most 1 positional argument, got {}", fn, a.pos.size());
  if (a.pos.size() == 1) {
    const Value& src = a.pos[0];
    if (src.is_dict()) {
      d->entries = src.dict_ref().entries;
    } else {
      for (const auto& item : iterate(src)) {
        if (!item.is_list() || item.items().size() != 2) fail("{}: sequence elements must be pairs", fn);
        d->set(item.items()[0], item.items()[1]);
      }
    }
  }
  for (const auto& [k, v] : a.kw) d->set(Value(k), v);
  return d;
}

}  // namespace

TestFn find_test(const std::string& name) {
  auto it = tests().find(name);
  return it == tests().end() ? nullptr : it->second;
}

bool has_test(const std::string& name) { return find_test(name) != nullptr; }

void add_globals(Frame& frame) {
  frame.set("range", Value::callable("range", [](Interpreter&, Args& a) -> Value {
    if (!a.kw.empty()) fail("range() takes no keyword arguments");
    if (a.pos.empty() || a.pos.size() > 3) fail("range expected 1 to 3 arguments, got {}", a.pos.size());
    for (const auto& v : a.pos)
      if (!v.is_integral()) fail("'{}' object cannot be interpreted as an integer", v.type_name());
    int64_t start = 0, stop, step = 1;
    if (a.pos.size() == 1) {
      stop = a.pos[0].as_int();
    } else {
      start = a.pos[0].as_int(), stop = a.pos[1].as_int();
      if (a.pos.size() == 3) step = a.pos[2].as_int();
    }
    if (step == 0) fail("range() arg 3 must not be zero");
    // The sandbox refuses ranges longer than MAX_RANGE = 100000.
    double n = step > 0 ? std::ceil((double(stop) - double(start)) / double(step)) : std::ceil((double(start) - double(stop)) / double(-step));
    if (n > 100000) fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    ValueList out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.emplace_back(i);
    return Value::list(std::move(out));
  }));
  frame.set("dict", Value::callable("dict", [](Interpreter&, Args& a) { return Value::dict(dict_from_args(a, "dict")); }));
  frame.set("namespace", Value::callable("namespace", [](Interpreter& in, Args& a) {
    auto d = dict_from_args(a, "namespace");
    in.track_namespace(d);
    return Value::namespace_(std::move(d));
  }));
  frame.set("joiner", Value::callable("joiner", [](Interpreter&, Args& a) -> Value {
    check_args(a, "joiner", 1, {"sep"});
    std::string sep = arg_or(a, 0, "sep", Value(", ")).to_str();
    auto used = std::make_shared<bool>(false);
    return Value::callable("joiner", [sep, used](Interpreter&, Args&) -> Value {
      if (!*used) {
        *used = true;
        return Value("");
      }
      return Value(sep);
    });
  }));
  frame.set("raise_exception", Value::callable("raise_exception", [](Interpreter& in, Args& a) -> Value {
    in.raise_from_template(a.pos.empty() ? std::string() : a.pos[0].to_str());
  }));
  frame.set("strftime_now", Value::callable("strftime_now", [](Interpreter&, Args& a) -> Value {
    if (a.pos.size() != 1 || !a.pos[0].is_string()) fail("strftime_now() takes one format string");
    std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    const std::string& f = a.pos[0].str();
    if (f.empty()) return Value("");
    std::string buf(f.size() * 8 + 256, '\0');
    size_t n = std::strftime(buf.data(), buf.size(), f.c_str(), &tm);
    if (n == 0) fail("strftime_now: cannot format '{}'", f);
    buf.resize(n);
    return Value(buf);
  }));
}

}  // namespace arbor::jinja
