// Python methods of str, list and dict that templates call (x.strip('\n'), d.items(), s.format(...)),
// and the mutators that transformers' ImmutableSandboxedEnvironment refuses.
#include <cstdio>
#include <set>

#include "text/jinja/interpreter.h"
#include "text/jinja/pystr.h"

namespace arbor::jinja {
namespace {

using Args = CallArgs;

const std::set<std::string> kStrMethods = {
    "strip",    "lstrip",     "rstrip",       "split",  "rsplit",  "startswith", "endswith", "upper",  "lower",
    "title",    "capitalize", "replace",      "find",   "rfind",   "index",      "rindex",   "count",  "join",
    "format",   "isdigit",    "isalpha",      "isalnum", "isspace", "islower",   "isupper",  "splitlines",
    "center",   "ljust",      "rjust",        "zfill",  "partition", "rpartition", "removeprefix", "removesuffix",
    "swapcase", "casefold",   "isnumeric",    "isdecimal", "istitle", "expandtabs"};
const std::set<std::string> kListMethods = {"index", "count", "copy", "append", "extend", "insert", "remove",
                                            "pop",   "clear", "sort", "reverse"};
const std::set<std::string> kDictMethods = {"keys", "values", "items", "get", "copy", "pop",
                                            "popitem", "setdefault", "update", "clear", "fromkeys"};
const std::set<std::string> kListUnsafe = {"append", "extend", "insert", "remove", "pop", "clear", "sort", "reverse"};
const std::set<std::string> kDictUnsafe = {"pop", "popitem", "setdefault", "update", "clear"};

std::optional<std::string> opt_str(const Value* v, const char* method) {
  if (!v || v->is_none()) return std::nullopt;
  if (!v->is_string()) fail("{} arg must be None or str", method);
  return v->str();
}

int64_t opt_int(const Value* v, int64_t def, const char* method) {
  if (!v || v->is_none()) return def;
  if (!v->is_integral()) fail("{}: '{}' object cannot be interpreted as an integer", method, v->type_name());
  return v->as_int();
}

// s[start:end] in code points, for find/count/startswith's optional bounds.
std::string cp_slice(const std::string& s, const Value* start, const Value* end) {
  if ((!start || start->is_none()) && (!end || end->is_none())) return s;
  return slice(Value(s), start ? *start : Value::none(), end ? *end : Value::none(), Value::none()).str();
}

bool affix(const std::string& s, const Value& x, bool prefix, const char* method) {
  auto one = [&](const Value& p) {
    if (!p.is_string()) fail("{} first arg must be str or a tuple of str, not {}", method, p.type_name());
    const std::string& t = p.str();
    if (t.size() > s.size()) return false;
    return prefix ? s.compare(0, t.size(), t) == 0 : s.compare(s.size() - t.size(), t.size(), t) == 0;
  };
  if (x.is_tuple()) {
    for (const auto& p : x.items())
      if (one(p)) return true;
    return false;
  }
  return one(x);
}

Value list_of(std::vector<std::string> parts) {
  ValueList out;
  out.reserve(parts.size());
  for (auto& p : parts) out.emplace_back(std::move(p));
  return Value::list(std::move(out));
}

// Python's format-spec mini language for str, int and float: [[fill]align][sign][0][width][.precision][type].
std::string format_spec(const Value& v, const std::string& spec) {
  if (spec.empty()) return v.to_str();
  auto cps = py::decode(spec);
  size_t i = 0;
  uint32_t fill = ' ';
  char align = 0, sign = '-', type = 0;
  auto is_align = [](uint32_t c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (cps.size() >= 2 && is_align(cps[1])) fill = cps[0], align = char(cps[1]), i = 2;
  else if (!cps.empty() && is_align(cps[0])) align = char(cps[0]), i = 1;
  if (i < cps.size() && (cps[i] == '+' || cps[i] == '-' || cps[i] == ' ')) sign = char(cps[i++]);
  if (i < cps.size() && cps[i] == '0') {
    if (!align) fill = '0', align = '=';
    ++i;
  }
  int64_t width = 0, prec = -1;
  while (i < cps.size() && py::is_digit(cps[i]) && width < 100000) width = width * 10 + (cps[i++] - '0');
  if (i < cps.size() && cps[i] == '.') {
    ++i;
    prec = 0;
    while (i < cps.size() && py::is_digit(cps[i]) && prec < 1000) prec = prec * 10 + (cps[i++] - '0');
  }
  if (i < cps.size()) type = char(cps[i++]);
  if (i != cps.size() || width >= 100000 || prec >= 1000) fail("Invalid format specifier '{}'", spec);
  std::string body;
  bool numeric = v.is_number();
  if (type == 's' || (type == 0 && v.is_string())) {
    if (!v.is_string()) fail("Unknown format code 's' for object of type '{}'", v.type_name());
    body = v.str();
    if (prec >= 0) body = slice(Value(body), Value::none(), Value(prec), Value::none()).str();
    numeric = false;
  } else if (numeric && (type == 'd' || (type == 0 && v.is_integral() && prec < 0))) {
    if (!v.is_integral()) fail("Unknown format code 'd' for object of type 'float'");
    int64_t x = v.as_int();
    body = fmt::format("{}", x);
    if (x >= 0 && sign != '-') body = std::string(1, sign) + body;
  } else if (numeric && (type == 'f' || type == 'F' || type == 'e' || type == 'E' || type == '%' || type == 'g' || type == 0)) {
    double x = v.as_double();
    char t = type == 0 ? 'g' : type == '%' ? 'f' : type;
    if (type == '%') x *= 100;
    if (type == 0 && prec < 0) {
      body = py::float_str(x);
    } else {
      char buf[1200];
      std::snprintf(buf, sizeof buf, (std::string("%.*") + t).c_str(), int(prec < 0 ? 6 : prec), x);
      body = buf;
      if (type == '%') body += "%";
    }
    if (x >= 0 && sign != '-' && body[0] != '-') body = std::string(1, sign) + body;
  } else {
    fail("Unsupported format specifier '{}' for {}", spec, v.type_name());
  }
  int64_t len = int64_t(py::length(body));
  if (width <= len) return body;
  if (!align) align = numeric ? '>' : '<';
  std::string f;
  py::append_utf8(f, fill);
  auto pad = [&](int64_t n) {
    std::string out;
    for (int64_t k = 0; k < n; ++k) out += f;
    return out;
  };
  int64_t total = width - len;
  switch (align) {
    case '<': return body + pad(total);
    case '>': return pad(total) + body;
    case '^': return pad(total / 2) + body + pad(total - total / 2);
    default: {  // '=': padding after the sign
      size_t s = !body.empty() && (body[0] == '+' || body[0] == '-' || body[0] == ' ') ? 1 : 0;
      return body.substr(0, s) + pad(total) + body.substr(s);
    }
  }
}

std::string str_format(Interpreter& in, const std::string& fmt_str, const Args& a) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t i = 0; i < fmt_str.size();) {
    char c = fmt_str[i];
    if (c == '}') {
      if (i + 1 < fmt_str.size() && fmt_str[i + 1] == '}') {
        out.push_back('}'), i += 2;
        continue;
      }
      fail("Single '}}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c), ++i;
      continue;
    }
    if (i + 1 < fmt_str.size() && fmt_str[i + 1] == '{') {
      out.push_back('{'), i += 2;
      continue;
    }
    size_t close = fmt_str.find('}', i);
    if (close == std::string::npos) fail("Single '{{' encountered in format string");
    std::string field = fmt_str.substr(i + 1, close - i - 1);
    i = close + 1;
    std::string spec, conv;
    if (auto colon = field.find(':'); colon != std::string::npos) spec = field.substr(colon + 1), field = field.substr(0, colon);
    if (auto bang = field.find('!'); bang != std::string::npos) conv = field.substr(bang + 1), field = field.substr(0, bang);
    // The field name: an index or a keyword, then .attr / [key] parts.
    size_t name_end = field.find_first_of(".[");
    std::string head = field.substr(0, name_end);
    Value v;
    if (head.empty()) {
      if (auto_idx >= a.pos.size()) fail("Replacement index {} out of range for positional args tuple", auto_idx);
      v = a.pos[auto_idx++];
    } else if (auto idx = py::parse_int(head, 10); idx && head.find_first_not_of("0123456789") == std::string::npos) {
      if (size_t(*idx) >= a.pos.size()) fail("Replacement index {} out of range for positional args tuple", *idx);
      v = a.pos[size_t(*idx)];
    } else {
      const Value* kv = nullptr;
      for (const auto& [k, x] : a.kw)
        if (k == head) kv = &x;
      if (!kv) fail("KeyError: '{}'", head);
      v = *kv;
    }
    for (size_t p = name_end; p != std::string::npos && p < field.size();) {
      if (field[p] == '.') {
        size_t e = field.find_first_of(".[", p + 1);
        v = in.get_attr(v, field.substr(p + 1, e == std::string::npos ? std::string::npos : e - p - 1));
        p = e;
      } else {
        size_t e = field.find(']', p);
        if (e == std::string::npos) fail("Missing ']' in format string");
        std::string key = field.substr(p + 1, e - p - 1);
        auto idx = py::parse_int(key, 10);
        v = in.get_item(v, idx && key.find_first_not_of("0123456789") == std::string::npos ? Value(*idx) : Value(key));
        p = e + 1;
      }
    }
    if (conv == "r") v = Value(v.repr());
    else if (conv == "s") v = Value(v.to_str());
    else if (!conv.empty()) fail("Unknown conversion specifier {}", conv);
    out += format_spec(v, spec);
    in.check_size(out.size(), "string");
  }
  return out;
}

Value str_method(Interpreter& in, const std::string& s, const std::string& m, Args& a) {
  auto pos = [&](size_t i, const char* n) { return find_arg(a, i, n); };
  if (m == "strip" || m == "lstrip" || m == "rstrip") {
    check_args(a, m.c_str(), 1, {"chars"});
    return Value(py::strip(s, opt_str(pos(0, "chars"), m.c_str()), m != "rstrip", m != "lstrip"));
  }
  if (m == "split" || m == "rsplit") {
    check_args(a, m.c_str(), 2, {"sep", "maxsplit"});
    auto sep = opt_str(pos(0, "sep"), m.c_str());
    if (sep && sep->empty()) fail("empty separator");
    int64_t maxsplit = opt_int(pos(1, "maxsplit"), -1, m.c_str());
    return list_of(m == "split" ? py::split(s, sep, maxsplit) : py::rsplit(s, sep, maxsplit));
  }
  if (m == "splitlines") {
    check_args(a, "splitlines", 1, {"keepends"});
    return list_of(py::splitlines(s, arg_or(a, 0, "keepends", Value(false)).truthy()));
  }
  if (m == "startswith" || m == "endswith") {
    check_args(a, m.c_str(), 3, {});
    if (a.pos.empty()) fail("{}() takes at least 1 argument (0 given)", m);
    std::string sub = cp_slice(s, pos(1, ""), pos(2, ""));
    return Value(affix(sub, a.pos[0], m == "startswith", m.c_str()));
  }
  if (m == "upper" || m == "lower" || m == "title" || m == "capitalize" || m == "swapcase" || m == "casefold") {
    check_args(a, m.c_str(), 0, {});
    if (m == "upper") return Value(py::upper(s));
    if (m == "lower" || m == "casefold") return Value(py::lower(s));
    if (m == "title") return Value(py::title(s));
    if (m == "capitalize") return Value(py::capitalize(s));
    auto cps = py::decode(s);
    for (auto& c : cps) c = py::is_upper(c) ? py::to_lower(c) : py::to_upper(c);
    return Value(py::encode(cps));
  }
  if (m == "replace") {
    check_args(a, "replace", 3, {});
    if (a.pos.size() < 2 || !a.pos[0].is_string() || !a.pos[1].is_string()) fail("replace() takes two str arguments");
    int64_t count = opt_int(pos(2, ""), -1, "replace");
    const std::string &old = a.pos[0].str(), &with = a.pos[1].str();
    if (with.size() > old.size()) in.check_size(s.size() + (size_t(py::count(s, old)) + 1) * (with.size() - old.size()), "string");
    return Value(py::replace(s, old, with, count));
  }
  if (m == "find" || m == "rfind" || m == "index" || m == "rindex" || m == "count") {
    check_args(a, m.c_str(), 3, {});
    if (a.pos.empty() || !a.pos[0].is_string()) fail("{}() must be given a str", m);
    const std::string& sub = a.pos[0].str();
    int64_t n = int64_t(py::length(s));
    int64_t start = opt_int(pos(1, ""), 0, m.c_str()), end = opt_int(pos(2, ""), n, m.c_str());
    if (start < 0) start = std::max<int64_t>(0, start + n);
    if (end < 0) end = std::max<int64_t>(0, end + n);
    end = std::min(end, n);
    if (start > end) return Value(m == "count" ? int64_t(0) : int64_t(-1));
    std::string window = slice(Value(s), Value(start), Value(end), Value::none()).str();
    if (m == "count") return Value(py::count(window, sub));
    size_t f = m[0] == 'r' ? window.rfind(sub) : window.find(sub);
    if (f == std::string::npos) {
      if (m == "index" || m == "rindex") fail("substring not found");
      return Value(int64_t(-1));
    }
    return Value(start + py::cp_index(window, f));
  }
  if (m == "join") {
    check_args(a, "join", 1, {});
    if (a.pos.empty()) fail("join() takes exactly one argument (0 given)");
    std::string out;
    size_t i = 0;
    for (const auto& item : iterate(a.pos[0])) {
      if (!item.is_string()) fail("sequence item {}: expected str instance, {} found", i, item.type_name());
      if (i++) out += s;
      out += item.str();
      in.check_size(out.size(), "string");
    }
    return Value(std::move(out));
  }
  if (m == "format") return Value(str_format(in, s, a));
  if (m == "isdigit" || m == "isalpha" || m == "isalnum" || m == "isspace" || m == "isnumeric" || m == "isdecimal") {
    check_args(a, m.c_str(), 0, {});
    auto cps = py::decode(s);
    if (cps.empty()) return Value(false);
    for (uint32_t c : cps) {
      bool ok = m == "isspace" ? py::is_space(c) : m == "isalpha" ? py::is_alpha(c) : m == "isalnum" ? py::is_alpha(c) || py::is_digit(c) : py::is_digit(c);
      if (!ok) return Value(false);
    }
    return Value(true);
  }
  if (m == "islower" || m == "isupper" || m == "istitle") {
    check_args(a, m.c_str(), 0, {});
    bool cased = false;
    if (m == "istitle") {
      bool prev_cased = false;
      for (uint32_t c : py::decode(s)) {
        if (py::is_upper(c)) {
          if (prev_cased) return Value(false);
          prev_cased = cased = true;
        } else if (py::is_lower(c)) {
          if (!prev_cased) return Value(false);
          prev_cased = cased = true;
        } else {
          prev_cased = false;
        }
      }
      return Value(cased);
    }
    for (uint32_t c : py::decode(s)) {
      if (m == "islower" ? py::is_upper(c) : py::is_lower(c)) return Value(false);
      cased = cased || (m == "islower" ? py::is_lower(c) : py::is_upper(c));
    }
    return Value(cased);
  }
  if (m == "center" || m == "ljust" || m == "rjust" || m == "zfill") {
    check_args(a, m.c_str(), m == "zfill" ? 1 : 2, {});
    if (a.pos.empty() || !a.pos[0].is_integral()) fail("{}() needs an integer width", m);
    int64_t width = a.pos[0].as_int(), len = int64_t(py::length(s));
    if (width <= len) return Value(s);
    in.check_size(size_t(width) * 4, "string");
    if (a.pos.size() > 1 && (!a.pos[1].is_string() || py::length(a.pos[1].str()) != 1))
      fail("The fill character must be exactly one character long");
    const std::string fill = a.pos.size() > 1 ? a.pos[1].str() : std::string(1, m == "zfill" ? '0' : ' ');
    int64_t total = width - len;
    int64_t left = m == "ljust" ? 0 : m == "rjust" || m == "zfill" ? total : total / 2 + (total & width & 1);
    auto pad = [&](int64_t n) {
      std::string out;
      for (int64_t k = 0; k < n; ++k) out += fill;
      return out;
    };
    if (m == "zfill" && !s.empty() && (s[0] == '+' || s[0] == '-')) return Value(s.substr(0, 1) + pad(total) + s.substr(1));
    return Value(pad(left) + s + pad(total - left));
  }
  if (m == "partition" || m == "rpartition") {
    check_args(a, m.c_str(), 1, {});
    if (a.pos.empty() || !a.pos[0].is_string()) fail("must be str");
    const std::string& sep = a.pos[0].str();
    if (sep.empty()) fail("empty separator");
    size_t f = m == "partition" ? s.find(sep) : s.rfind(sep);
    if (f == std::string::npos)
      return m == "partition" ? Value::list({Value(s), Value(""), Value("")}, true) : Value::list({Value(""), Value(""), Value(s)}, true);
    return Value::list({Value(s.substr(0, f)), Value(sep), Value(s.substr(f + sep.size()))}, true);
  }
  if (m == "removeprefix" || m == "removesuffix") {
    check_args(a, m.c_str(), 1, {});
    if (a.pos.empty() || !a.pos[0].is_string()) fail("{}() argument must be str", m);
    const std::string& x = a.pos[0].str();
    if (m == "removeprefix" && s.compare(0, x.size(), x) == 0) return Value(s.substr(x.size()));
    if (m == "removesuffix" && !x.empty() && s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0)
      return Value(s.substr(0, s.size() - x.size()));
    return Value(s);
  }
  if (m == "expandtabs") {
    check_args(a, m.c_str(), 1, {"tabsize"});
    int64_t ts = opt_int(pos(0, "tabsize"), 8, "expandtabs");
    std::string out;
    int64_t col = 0;
    for (uint32_t c : py::decode(s)) {
      if (c == '\t') {
        int64_t n = ts > 0 ? ts - col % ts : 0;
        out.append(size_t(n), ' '), col += n;
      } else {
        py::append_utf8(out, c);
        col = c == '\n' || c == '\r' ? 0 : col + 1;
      }
      in.check_size(out.size(), "string");
    }
    return Value(out);
  }
  fail("'str' object has no attribute '{}'", m);
}

}  // namespace

bool has_method(const Value& obj, const std::string& name) {
  if (obj.is_string()) return kStrMethods.count(name) != 0;
  if (obj.is_list()) return obj.is_tuple() ? (name == "index" || name == "count") : kListMethods.count(name) != 0;
  if (obj.is_dict()) return kDictMethods.count(name) != 0;
  return false;
}

bool is_unsafe_method(const Value& obj, const std::string& name) {
  if (obj.is_list() && !obj.is_tuple()) return kListUnsafe.count(name) != 0;
  if (obj.is_dict()) return kDictUnsafe.count(name) != 0;
  return false;
}

Value call_method(Interpreter& in, const Value& obj, const std::string& m, Args& a) {
  if (is_unsafe_method(obj, m)) fail("access to attribute '{}' of '{}' object is unsafe.", m, obj.type_name());
  if (obj.is_string()) return str_method(in, obj.str(), m, a);
  if (obj.is_list()) {
    const ValueList& items = obj.items();
    if (m == "copy") {
      check_args(a, "copy", 0, {});
      return Value::list(items);
    }
    check_args(a, m.c_str(), m == "index" ? 3 : 1, {});
    if (a.pos.empty()) fail("{}() takes at least one argument", m);
    if (m == "count") {
      int64_t n = 0;
      for (const auto& x : items) n += py_equal(x, a.pos[0]);
      return Value(n);
    }
    for (size_t i = 0; i < items.size(); ++i)
      if (py_equal(items[i], a.pos[0])) return Value(int64_t(i));
    fail("{} is not in list", a.pos[0].repr());
  }
  if (obj.is_dict()) {
    const Dict& d = obj.dict_ref();
    if (m == "get") {
      check_args(a, "get", 2, {});
      if (a.pos.empty()) fail("get expected at least 1 argument, got 0");
      const Value* v = d.find(a.pos[0]);
      return v ? *v : (a.pos.size() > 1 ? a.pos[1] : Value::none());
    }
    check_args(a, m.c_str(), 0, {});
    if (m == "copy") return Value::dict(std::make_shared<Dict>(d));
    ValueList out;
    for (const auto& [k, v] : d.entries) {
      if (m == "keys") out.push_back(k);
      else if (m == "values") out.push_back(v);
      else out.push_back(Value::list({k, v}, true));
    }
    if (m == "keys" || m == "values" || m == "items") return Value::list(std::move(out));
  }
  fail("'{}' object has no attribute '{}'", obj.type_name(), m);
}

}  // namespace arbor::jinja
