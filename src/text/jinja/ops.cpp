// Python operators on Jinja values: arithmetic with Python's int/float rules, `in`, slicing, iteration.
#include <cmath>

#include "text/jinja/interpreter.h"
#include "text/jinja/pystr.h"

namespace arbor::jinja {

ValueList iterate(const Value& v) {
  if (v.is_list()) return v.items();
  if (v.is_dict() || v.is_namespace()) {
    ValueList keys;
    keys.reserve(v.dict_ref().entries.size());
    for (const auto& e : v.dict_ref().entries) keys.push_back(e.first);
    return keys;
  }
  if (v.is_string()) {
    ValueList chars;
    for (uint32_t cp : py::decode(v.str())) {
      std::string s;
      py::append_utf8(s, cp);
      chars.emplace_back(std::move(s));
    }
    return chars;
  }
  if (v.is_undefined()) return {};
  fail("'{}' object is not iterable", v.type_name());
}

bool contains(const Value& c, const Value& item) {
  if (c.is_string()) return item.is_string() && c.str().find(item.str()) != std::string::npos;
  if (c.is_list()) {
    for (const auto& x : c.items())
      if (py_equal(x, item)) return true;
    return false;
  }
  if (c.is_dict()) return c.dict_ref().find(item) != nullptr;
  return false;
}

static int64_t floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

static int64_t pymod(int64_t a, int64_t b) {
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

static Value repeat(const Value& seq, int64_t n, const Interpreter& in) {
  if (n <= 0) return seq.is_string() ? Value(std::string()) : Value::list({}, seq.is_tuple());
  if (seq.is_string()) {
    in.check_size(seq.str().size() * size_t(std::min<int64_t>(n, int64_t(1) << 40)), "string");
    std::string out;
    out.reserve(seq.str().size() * size_t(n));
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value(std::move(out));
  }
  in.check_size(seq.items().size() * 16 * size_t(std::min<int64_t>(n, int64_t(1) << 40)), "list");
  ValueList out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return Value::list(std::move(out), seq.is_tuple());
}

Value binary_op(const std::string& op, const Value& a, const Value& b, const Interpreter& in) {
  if (op == "~") {
    std::string s = a.to_str() + b.to_str();
    in.check_size(s.size(), "string");
    return Value(std::move(s));
  }
  if (a.is_undefined()) fail("{}", a.str().empty() ? "value is undefined" : a.str());
  if (b.is_undefined()) fail("{}", b.str().empty() ? "value is undefined" : b.str());
  auto unsupported = [&]() -> Value {
    fail("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name());
  };
  if (a.is_number() && b.is_number()) {
    bool fl = a.is_float() || b.is_float();
    double x = a.as_double(), y = b.as_double();
    int64_t i = a.as_int(), j = b.as_int(), r = 0;
    if (op == "+") {
      if (fl) return Value(x + y);
      if (__builtin_add_overflow(i, j, &r)) fail("integer overflow in {} + {}", i, j);
      return Value(r);
    }
    if (op == "-") {
      if (fl) return Value(x - y);
      if (__builtin_sub_overflow(i, j, &r)) fail("integer overflow in {} - {}", i, j);
      return Value(r);
    }
    if (op == "*") {
      if (fl) return Value(x * y);
      if (__builtin_mul_overflow(i, j, &r)) fail("integer overflow in {} * {}", i, j);
      return Value(r);
    }
    if (op == "/") {
      if (y == 0) fail("division by zero");
      return Value(x / y);
    }
    if (op == "//" || op == "%") {
      if (fl ? y == 0 : j == 0) fail("{}", fl ? "float floor division by zero" : "integer division or modulo by zero");
      if (!fl) {
        if (i == INT64_MIN && j == -1) {
          if (op == "%") return Value(int64_t(0));
          fail("integer overflow in {} // {}", i, j);
        }
        return Value(op == "//" ? floordiv(i, j) : pymod(i, j));
      }
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      if (op == "%") return Value(m == 0 ? std::copysign(0.0, y) : m);
      double d = (x - m) / y;
      double fd = std::floor(d);
      if (d - fd > 0.5) fd += 1;
      return Value(d == 0 ? std::copysign(0.0, x / y) : fd);
    }
    if (op == "**") {
      if (!fl && j >= 0) {
        int64_t acc = 1, base = i;
        for (int64_t e = j; e > 0; e >>= 1) {
          if (e & 1)
            if (__builtin_mul_overflow(acc, base, &acc)) fail("integer overflow in {} ** {}", i, j);
          if (e > 1 && __builtin_mul_overflow(base, base, &base)) {
            if (i == 0 || i == 1 || i == -1) break;
            fail("integer overflow in {} ** {}", i, j);
          }
        }
        return Value(acc);
      }
      if (x == 0 && y < 0) fail("0.0 cannot be raised to a negative power");
      double p = std::pow(x, y);
      if (std::isnan(p) && !std::isnan(x) && !std::isnan(y)) fail("negative number cannot be raised to a fractional power");
      return Value(p);
    }
    return unsupported();
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      in.check_size(a.str().size() + b.str().size(), "string");
      return Value(a.str() + b.str());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      ValueList out = a.items();
      out.insert(out.end(), b.items().begin(), b.items().end());
      return Value::list(std::move(out), a.is_tuple());
    }
    if (a.is_string()) fail("can only concatenate str (not \"{}\") to str", b.type_name());
    if (a.is_list() && !a.is_tuple()) fail("can only concatenate list (not \"{}\") to list", b.type_name());
    return unsupported();
  }
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && b.is_integral()) return repeat(a, b.as_int(), in);
    if ((b.is_string() || b.is_list()) && a.is_integral()) return repeat(b, a.as_int(), in);
    if (a.is_string() || b.is_string() || a.is_list() || b.is_list())
      fail("can't multiply sequence by non-int of type '{}'", (a.is_string() || a.is_list() ? b : a).type_name());
  }
  if (op == "%" && a.is_string()) fail("printf-style string formatting ('%' on strings) is not supported");
  return unsupported();
}

// Python's slice.indices(): clamps start/stop for a sequence of length n.
static void slice_indices(int64_t n, const Value& start, const Value& stop, const Value& step, int64_t& b, int64_t& e, int64_t& s) {
  auto as_index = [](const Value& v, const char* what) -> int64_t {
    if (!v.is_integral()) fail("slice {} must be an integer or None, not {}", what, v.type_name());
    return v.as_int();
  };
  s = step.is_none() ? 1 : as_index(step, "step");
  if (s == 0) fail("slice step cannot be zero");
  if (s == INT64_MIN) s = -INT64_MAX;
  auto clamp = [&](const Value& v, bool is_start) -> int64_t {
    if (v.is_none()) return s > 0 ? (is_start ? 0 : n) : (is_start ? n - 1 : -1);
    int64_t i = as_index(v, is_start ? "start" : "stop");
    if (i < 0) {
      i = i < -n ? (s > 0 ? 0 : -1) : i + n;
    } else if (i >= n) {
      i = s > 0 ? n : n - 1;
    }
    return i;
  };
  b = clamp(start, true);
  e = clamp(stop, false);
}

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (!(obj.is_list() || obj.is_string())) fail("'{}' object is not subscriptable", obj.type_name());
  std::vector<uint32_t> cps;
  if (obj.is_string()) cps = py::decode(obj.str());
  int64_t n = obj.is_list() ? int64_t(obj.items().size()) : int64_t(cps.size());
  int64_t b, e, s;
  slice_indices(n, start, stop, step, b, e, s);
  std::vector<size_t> idx;
  for (int64_t i = b; s > 0 ? i < e : i > e; i += s) {
    idx.push_back(size_t(i));
    if ((s > 0 && i > INT64_MAX - s) || (s < 0 && i < INT64_MIN - s)) break;
  }
  if (obj.is_list()) {
    ValueList out;
    out.reserve(idx.size());
    for (size_t i : idx) out.push_back(obj.items()[i]);
    return Value::list(std::move(out), obj.is_tuple());
  }
  std::string out;
  for (size_t i : idx) py::append_utf8(out, cps[i]);
  return Value(std::move(out));
}

}  // namespace arbor::jinja
