// Jinja values: Python str()/repr(), truthiness, equality, ordering, and JSON in and out.
#include "text/jinja/value.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "text/jinja/pystr.h"

namespace arbor::jinja {

uint16_t Value::nested_depth(const ValueList& items) {
  int d = 0;
  for (const auto& x : items) d = std::max(d, int(x.depth_));
  if (d + 1 > kMaxNesting) fail("lists and dicts nested deeper than {} levels", kMaxNesting);
  return uint16_t(d + 1);
}

uint16_t Value::nested_depth(const Dict& dict) {
  int d = 0;
  for (const auto& e : dict.entries) d = std::max({d, int(e.first.depth_), int(e.second.depth_)});
  if (d + 1 > kMaxNesting) fail("lists and dicts nested deeper than {} levels", kMaxNesting);
  return uint16_t(d + 1);
}

Value Value::list(ValueList items, bool tuple) {
  Value v(Kind::List);
  v.tuple_ = tuple;
  v.depth_ = nested_depth(items);
  v.list_ = std::make_shared<const ValueList>(std::move(items));
  return v;
}

Value Value::dict(std::shared_ptr<Dict> d) {
  Value v(Kind::Dict);
  v.depth_ = nested_depth(*d);
  v.dict_ = std::move(d);
  return v;
}

Value Value::dict() { return dict(std::make_shared<Dict>()); }

Value Value::namespace_(std::shared_ptr<Dict> d) {
  Value v(Kind::Namespace);
  v.depth_ = nested_depth(*d);
  v.dict_ = std::move(d);
  return v;
}

Value Value::callable(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn) {
  Value v(Kind::Callable);
  v.fn_ = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool:
    case Kind::Int: return int_ != 0;
    case Kind::Float: return float_ != 0.0;
    case Kind::String: return !str_.empty();
    case Kind::List: return !list_->empty();
    case Kind::Dict: return !dict_->entries.empty();
    default: return true;
  }
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return tuple_ ? "tuple" : "list";
    case Kind::Dict: return "dict";
    case Kind::Callable: return "function";
    case Kind::Namespace: return "Namespace";
  }
  return "?";
}

// Namespaces are mutable and can contain themselves: printing stops at a depth limit.
struct ReprDepth {
  static inline thread_local int depth = 0;
  ReprDepth() {
    if (++depth > kMaxNesting + 8) {
      depth = 0;
      fail("value nested too deeply to print (a namespace that contains itself?)");
    }
  }
  ~ReprDepth() { depth = depth > 0 ? depth - 1 : 0; }
};

static std::string dict_repr(const Dict& d) {
  ReprDepth guard;
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : d.entries) {
    if (!first) out += ", ";
    first = false;
    out += k.repr() + ": " + v.repr();
  }
  return out + "}";
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::String: return py::repr_string(str_);
    case Kind::Undefined: return "Undefined";
    case Kind::List: {
      ReprDepth guard;
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i) out += ", ";
        out += (*list_)[i].repr();
      }
      if (tuple_ && list_->size() == 1) out += ",";
      return out + (tuple_ ? ")" : "]");
    }
    default: return to_str();
  }
}

std::string Value::to_str() const {
  switch (kind_) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return int_ ? "True" : "False";
    case Kind::Int: return fmt::format("{}", int_);
    case Kind::Float: return py::float_str(float_);
    case Kind::String: return str_;
    case Kind::List: return repr();
    case Kind::Dict: return dict_repr(*dict_);
    case Kind::Callable: return fmt::format("<function {}>", fn_->name);
    case Kind::Namespace: return "<Namespace " + dict_repr(*dict_) + ">";
  }
  return "";
}

bool py_equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::Undefined:
    case K::None: return true;
    case K::String: return a.str() == b.str();
    case K::List: {
      if (a.is_tuple() != b.is_tuple() || a.items().size() != b.items().size()) return false;
      for (size_t i = 0; i < a.items().size(); ++i)
        if (!py_equal(a.items()[i], b.items()[i])) return false;
      return true;
    }
    case K::Dict: {
      const auto& da = a.dict_ref();
      const auto& db = b.dict_ref();
      if (da.entries.size() != db.entries.size()) return false;
      for (const auto& [k, v] : da.entries) {
        const Value* o = db.find(k);
        if (!o || !py_equal(v, *o)) return false;
      }
      return true;
    }
    case K::Namespace: return a.dict_ptr() == b.dict_ptr();
    case K::Callable: return &a.fn() == &b.fn();
    default: return false;
  }
}

bool py_less(const Value& a, const Value& b, bool* ok) {
  *ok = true;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();  // UTF-8 byte order == code point order
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (py_equal(x[i], y[i])) continue;
      return py_less(x[i], y[i], ok);
    }
    return x.size() < y.size();
  }
  *ok = false;
  return false;
}

const Value* Dict::find(const Value& key) const {
  for (const auto& e : entries)
    if (py_equal(e.first, key)) return &e.second;
  return nullptr;
}

const Value* Dict::find(const std::string& key) const {
  for (const auto& e : entries)
    if (e.first.is_string() && e.first.str() == key) return &e.second;
  return nullptr;
}

void Dict::set(const Value& key, Value v) {
  for (auto& e : entries)
    if (py_equal(e.first, key)) {
      e.second = std::move(v);
      return;
    }
  entries.emplace_back(key, std::move(v));
}

template <typename J>
static Value from_json_impl(const J& j, int depth = 0) {
  if (depth > kMaxNesting) fail("jinja: JSON input nested deeper than {} levels", kMaxNesting);
  switch (j.type()) {
    case J::value_t::null: return Value::none();
    case J::value_t::boolean: return Value(j.template get<bool>());
    case J::value_t::number_integer: return Value(j.template get<int64_t>());
    case J::value_t::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      if (u > uint64_t(INT64_MAX)) return Value(double(u));
      return Value(int64_t(u));
    }
    case J::value_t::number_float: return Value(j.template get<double>());
    case J::value_t::string: return Value(j.template get<std::string>());
    case J::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(from_json_impl(x, depth + 1));
      return Value::list(std::move(items));
    }
    case J::value_t::object: {
      auto d = std::make_shared<Dict>();
      d->entries.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d->entries.emplace_back(Value(it.key()), from_json_impl(it.value(), depth + 1));
      return Value::dict(std::move(d));
    }
    default: fail("jinja: cannot convert a binary JSON value");
  }
}

Value from_json(const json& j) { return from_json_impl(j); }
Value from_json(const nlohmann::ordered_json& j) { return from_json_impl(j); }

static void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out.push_back('"');
  auto put_u = [&](uint32_t c) { out += fmt::format("\\u{:04x}", c); };
  for (uint32_t c : py::decode(s)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          put_u(c);
        } else if (ensure_ascii && c >= 0x80) {
          if (c >= 0x10000) {
            uint32_t v = c - 0x10000;
            put_u(0xD800 + (v >> 10)), put_u(0xDC00 + (v & 0x3FF));
          } else {
            put_u(c);
          }
        } else {
          py::append_utf8(out, c);
        }
    }
  }
  out.push_back('"');
}

static std::string json_key(const Value& k) {
  // json.dumps converts these key types to strings; anything else is a TypeError.
  if (k.is_string()) return k.str();
  if (k.is_bool()) return k.as_bool() ? "true" : "false";
  if (k.is_int()) return fmt::format("{}", k.as_int());
  if (k.is_float()) return py::float_str(k.as_double());
  if (k.is_none()) return "null";
  fail("keys must be str, int, float, bool or None, not {}", k.type_name());
}

static void dump(std::string& out, const Value& v, const JsonDumpOptions& opt, int level) {
  if (level > 200) fail("tojson: nesting deeper than 200 levels");
  auto newline = [&](int lv) {
    if (!opt.has_indent) return;
    out.push_back('\n');
    for (int i = 0; i < lv; ++i) out += opt.indent;
  };
  switch (v.kind()) {
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::Int: out += fmt::format("{}", v.as_int()); return;
    case Value::Kind::Float: {
      double d = v.as_double();
      if (std::isnan(d)) out += "NaN";
      else if (std::isinf(d)) out += d < 0 ? "-Infinity" : "Infinity";
      else out += py::float_str(d);
      return;
    }
    case Value::Kind::String: json_string(out, v.str(), opt.ensure_ascii); return;
    case Value::Kind::List: {
      const auto& items = v.items();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += opt.item_sep;
        newline(level + 1);
        dump(out, items[i], opt, level + 1);
      }
      newline(level);
      out.push_back(']');
      return;
    }
    case Value::Kind::Dict: {
      const auto& d = v.dict_ref();
      if (d.entries.empty()) {
        out += "{}";
        return;
      }
      std::vector<std::pair<std::string, const Value*>> kv;
      for (const auto& [k, x] : d.entries) kv.emplace_back(json_key(k), &x);
      if (opt.sort_keys) std::stable_sort(kv.begin(), kv.end(), [](auto& a, auto& b) { return a.first < b.first; });
      out.push_back('{');
      for (size_t i = 0; i < kv.size(); ++i) {
        if (i) out += opt.item_sep;
        newline(level + 1);
        json_string(out, kv[i].first, opt.ensure_ascii);
        out += opt.key_sep;
        dump(out, *kv[i].second, opt, level + 1);
      }
      newline(level);
      out.push_back('}');
      return;
    }
    default: fail("Object of type {} is not JSON serializable", v.type_name());
  }
}

std::string to_json_string(const Value& v, const JsonDumpOptions& opt) {
  std::string out;
  dump(out, v, opt, 0);
  return out;
}

}  // namespace arbor::jinja
