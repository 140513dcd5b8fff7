// Jinja filters: the set real chat templates use, with jinja2/filters.py's argument names, defaults and
// edge cases (undefined operands, case-insensitive sorting, transformers' tojson).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "text/jinja/interpreter.h"
#include "text/jinja/pystr.h"

namespace arbor::jinja {
namespace {

using Args = CallArgs;

// attribute="a.b.0": Jinja's make_attrgetter, item lookup per dotted part (digits are indices).
Value get_path(Interpreter& in, const Value& v, const Value& attr) {
  if (!attr.is_string()) return in.get_item(v, attr);
  Value cur = v;
  for (const auto& part : py::split(attr.str(), std::string("."), -1)) {
    auto idx = py::parse_int(part, 10);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = digits && idx ? in.get_item(cur, Value(*idx)) : in.get_item(cur, Value(part));
  }
  return cur;
}

Value lower_if_str(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value(py::lower(v.str())) : v;
}

bool less_or_fail(const Value& a, const Value& b) {
  bool ok;
  bool r = py_less(a, b, &ok);
  if (!ok) fail("'<' not supported between instances of '{}' and '{}'", a.type_name(), b.type_name());
  return r;
}

// sorted(items, key=key, reverse=reverse): stable, and reverse keeps equal items in order as Python does.
void sort_by_key(ValueList& items, std::vector<Value> keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return reverse ? less_or_fail(keys[b], keys[a]) : less_or_fail(keys[a], keys[b]);
  });
  ValueList out;
  out.reserve(items.size());
  for (size_t i : order) out.push_back(items[i]);
  items = std::move(out);
}

Value f_abs(Interpreter&, const Value& v, Args& a) {
  check_args(a, "abs", 0, {});
  if (v.is_float()) return Value(std::fabs(v.as_double()));
  if (v.is_integral()) {
    if (v.as_int() == INT64_MIN) fail("integer overflow");
    return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
  }
  fail("bad operand type for abs(): '{}'", v.type_name());
}

Value f_attr(Interpreter& in, const Value& v, Args& a) {
  check_args(a, "attr", 1, {"name"});
  Value name = arg_or(a, 0, "name", Value::undefined());
  if (!name.is_string()) fail("attribute name must be a string");
  if (v.is_namespace() || has_method(v, name.str())) return in.get_attr(v, name.str());
  if (v.is_undefined()) fail("{}", v.str());
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", v.type_name(), name.str()));
}

Value f_batch(Interpreter&, const Value& v, Args& a) {
  check_args(a, "batch", 2, {"linecount", "fill_with"});
  Value n = arg_or(a, 0, "linecount", Value::undefined());
  if (!n.is_integral() || n.as_int() <= 0) fail("batch: linecount must be a positive integer");
  const Value* fill = find_arg(a, 1, "fill_with");
  size_t count = size_t(n.as_int());
  ValueList out, tmp;
  for (auto& item : iterate(v)) {
    if (tmp.size() == count) out.push_back(Value::list(std::move(tmp))), tmp.clear();
    tmp.push_back(std::move(item));
  }
  if (!tmp.empty()) {
    if (fill && !fill->is_none())
      while (tmp.size() < count) tmp.push_back(*fill);
    out.push_back(Value::list(std::move(tmp)));
  }
  return Value::list(std::move(out));
}

Value f_capitalize(Interpreter&, const Value& v, Args& a) {
  check_args(a, "capitalize", 0, {});
  return Value(py::capitalize(v.to_str()));
}

Value f_center(Interpreter& in, const Value& v, Args& a) {
  check_args(a, "center", 1, {"width"});
  Value w = arg_or(a, 0, "width", Value(80));
  if (!w.is_integral()) fail("center: width must be an integer");
  std::string s = v.to_str();
  int64_t len = int64_t(py::length(s)), width = w.as_int();
  if (width <= len) return Value(s);
  in.check_size(size_t(width), "string");
  int64_t total = width - len, left = total / 2 + (total & width & 1);
  return Value(std::string(size_t(left), ' ') + s + std::string(size_t(total - left), ' '));
}

Value f_length(Interpreter&, const Value& v, Args& a) {
  check_args(a, "length", 0, {});
  if (v.is_string()) return Value(int64_t(py::length(v.str())));
  if (v.is_list()) return Value(int64_t(v.items().size()));
  if (v.is_dict()) return Value(int64_t(v.dict_ref().entries.size()));
  if (v.is_undefined()) return Value(int64_t(0));
  fail("object of type '{}' has no len()", v.type_name());
}

Value f_default(Interpreter&, const Value& v, Args& a) {
  check_args(a, "default", 2, {"default_value", "boolean"});
  Value def = arg_or(a, 0, "default_value", Value(""));
  bool boolean = arg_or(a, 1, "boolean", Value(false)).truthy();
  if (v.is_undefined() || (boolean && !v.truthy())) return def;
  return v;
}

Value f_dictsort(Interpreter&, const Value& v, Args& a) {
  check_args(a, "dictsort", 3, {"case_sensitive", "by", "reverse"});
  bool cs = arg_or(a, 0, "case_sensitive", Value(false)).truthy();
  Value by = arg_or(a, 1, "by", Value("key"));
  bool reverse = arg_or(a, 2, "reverse", Value(false)).truthy();
  if (!v.is_dict()) fail("dictsort: expected a mapping, got {}", v.type_name());
  int pos = by.is_string() && by.str() == "key" ? 0 : by.is_string() && by.str() == "value" ? 1 : -1;
  if (pos < 0) fail("You can only sort by either \"key\" or \"value\"");
  ValueList items;
  std::vector<Value> keys;
  for (const auto& [k, x] : v.dict_ref().entries) {
    items.push_back(Value::list({k, x}, true));
    keys.push_back(lower_if_str(pos == 0 ? k : x, cs));
  }
  sort_by_key(items, std::move(keys), reverse);
  return Value::list(std::move(items));
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

Value f_escape(Interpreter&, const Value& v, Args& a) {
  check_args(a, "escape", 0, {});
  return Value(html_escape(v.to_str()));
}

Value f_first(Interpreter&, const Value& v, Args& a) {
  check_args(a, "first", 0, {});
  ValueList items = iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(Interpreter&, const Value& v, Args& a) {
  check_args(a, "last", 0, {});
  ValueList items = iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value f_float(Interpreter&, const Value& v, Args& a) {
  check_args(a, "float", 1, {"default"});
  Value def = arg_or(a, 0, "default", Value(0.0));
  if (v.is_number()) return Value(v.as_double());
  if (v.is_string())
    if (auto f = py::parse_float(v.str())) return Value(*f);
  return def;
}

Value f_int(Interpreter&, const Value& v, Args& a) {
  check_args(a, "int", 2, {"default", "base"});
  Value def = arg_or(a, 0, "default", Value(0));
  Value base = arg_or(a, 1, "base", Value(10));
  if (v.is_integral()) return Value(v.as_int());
  if (v.is_float()) {
    double d = v.as_double();
    if (std::isnan(d)) return def;
    if (std::isinf(d)) fail("cannot convert float infinity to integer");
    if (std::fabs(d) >= 9.2e18) fail("int: {} is out of the supported integer range", v.to_str());
    return Value(int64_t(d));
  }
  if (v.is_string()) {
    if (base.is_integral())
      if (auto i = py::parse_int(v.str(), int(base.as_int()))) return Value(*i);
    if (auto f = py::parse_float(v.str())) {
      if (std::isnan(*f)) return def;
      if (std::isinf(*f)) fail("cannot convert float infinity to integer");
      if (std::fabs(*f) >= 9.2e18) fail("int: {} is out of the supported integer range", v.str());
      return Value(int64_t(*f));
    }
  }
  return def;
}

Value f_indent(Interpreter& in, const Value& v, Args& a) {
  check_args(a, "indent", 3, {"width", "first", "blank"});
  Value width = arg_or(a, 0, "width", Value(4));
  bool first = arg_or(a, 1, "first", Value(false)).truthy();
  bool blank = arg_or(a, 2, "blank", Value(false)).truthy();
  std::string ind;
  if (width.is_string()) {
    ind = width.str();
  } else if (width.is_integral()) {
    in.check_size(size_t(std::max<int64_t>(0, std::min<int64_t>(width.as_int(), int64_t(1) << 40))), "indent");
    ind = std::string(size_t(std::max<int64_t>(0, width.as_int())), ' ');
  } else {
    fail("indent: width must be an integer or a string");
  }
  std::string s = v.to_str() + "\n";  // jinja2's quirk for splitlines()
  auto lines = py::splitlines(s, false);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + ind : "") + lines[i];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (lines[i].empty() ? lines[i] : ind + lines[i]);
  }
  if (first) rv = ind + rv;
  in.check_size(rv.size(), "string");
  return Value(rv);
}

Value f_items(Interpreter&, const Value& v, Args& a) {
  check_args(a, "items", 0, {});
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict()) fail("Can only get item pairs from a mapping.");
  ValueList out;
  for (const auto& [k, x] : v.dict_ref().entries) out.push_back(Value::list({k, x}, true));
  return Value::list(std::move(out));
}

Value f_join(Interpreter& in, const Value& v, Args& a) {
  check_args(a, "join", 2, {"d", "attribute"});
  std::string sep = arg_or(a, 0, "d", Value("")).to_str();
  const Value* attr = find_arg(a, 1, "attribute");
  std::string out;
  bool first = true;
  for (const auto& item : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += (attr && !attr->is_none() ? get_path(in, item, *attr) : item).to_str();
    in.check_size(out.size(), "string");
  }
  return Value(std::move(out));
}

Value f_list(Interpreter&, const Value& v, Args& a) {
  check_args(a, "list", 0, {});
  return Value::list(iterate(v));
}

Value f_lower(Interpreter&, const Value& v, Args& a) {
  check_args(a, "lower", 0, {});
  return Value(py::lower(v.to_str()));
}
Value f_upper(Interpreter&, const Value& v, Args& a) {
  check_args(a, "upper", 0, {});
  return Value(py::upper(v.to_str()));
}

// Jinja's title filter capitalises each word split at whitespace, '-', '(', '{', '[' and '<'.
Value f_title(Interpreter&, const Value& v, Args& a) {
  check_args(a, "title", 0, {});
  auto cps = py::decode(v.to_str());
  bool start = true;
  for (auto& c : cps) {
    bool sep = py::is_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      start = true;
    } else {
      c = start ? py::to_upper(c) : py::to_lower(c);
      start = false;
    }
  }
  return Value(py::encode(cps));
}

Value f_map(Interpreter& in, const Value& v, Args& a) {
  ValueList out;
  const Value* attr = nullptr;
  const Value* def = nullptr;
  for (const auto& [k, x] : a.kw) {
    if (k == "attribute") attr = &x;
    else if (k == "default") def = &x;
  }
  if (attr) {
    for (const auto& item : iterate(v)) {
      Value r = get_path(in, item, *attr);
      out.push_back(r.is_undefined() && def ? *def : r);
    }
    return Value::list(std::move(out));
  }
  if (a.pos.empty()) fail("map requires a filter argument");
  if (!a.pos[0].is_string()) fail("map: the filter name must be a string");
  std::string name = a.pos[0].str();
  Args rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  if (!find_filter(name)) fail("No filter named '{}'.", name);
  for (const auto& item : iterate(v)) {
    Args copy = rest;
    out.push_back(in.filter(name, item, copy));
  }
  return Value::list(std::move(out));
}

Value select_impl(Interpreter& in, const Value& v, Args& a, bool by_attr, bool want) {
  size_t first = by_attr ? 1 : 0;
  if (by_attr && a.pos.empty()) fail("Missing parameter for attribute name");
  std::string test_name;
  if (a.pos.size() > first) {
    if (!a.pos[first].is_string()) fail("the test name must be a string");
    test_name = a.pos[first].str();
    if (!find_test(test_name)) fail("No test named '{}'.", test_name);
  }
  Args rest;
  if (a.pos.size() > first + 1) rest.pos.assign(a.pos.begin() + long(first) + 1, a.pos.end());
  rest.kw = a.kw;
  ValueList out;
  for (const auto& item : iterate(v)) {
    Value x = by_attr ? get_path(in, item, a.pos[0]) : item;
    bool r;
    if (test_name.empty()) {
      r = x.truthy();
    } else {
      Args copy = rest;
      r = in.test(test_name, x, copy);
    }
    if (r == want) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value f_select(Interpreter& in, const Value& v, Args& a) { return select_impl(in, v, a, false, true); }
Value f_reject(Interpreter& in, const Value& v, Args& a) { return select_impl(in, v, a, false, false); }
Value f_selectattr(Interpreter& in, const Value& v, Args& a) { return select_impl(in, v, a, true, true); }
Value f_rejectattr(Interpreter& in, const Value& v, Args& a) { return select_impl(in, v, a, true, false); }

Value min_max(Interpreter& in, const Value& v, Args& a, bool is_max, const char* name) {
  check_args(a, name, 2, {"case_sensitive", "attribute"});
  bool cs = arg_or(a, 0, "case_sensitive", Value(false)).truthy();
  const Value* attr = find_arg(a, 1, "attribute");
  ValueList items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key;
  for (size_t i = 0; i < items.size(); ++i) {
    Value key = lower_if_str(attr && !attr->is_none() ? get_path(in, items[i], *attr) : items[i], cs);
    if (i == 0 || (is_max ? less_or_fail(best_key, key) : less_or_fail(key, best_key))) best = i, best_key = key;
  }
  return items[best];
}
Value f_min(Interpreter& in, const Value& v, Args& a) { return min_max(in, v, a, false, "min"); }
Value f_max(Interpreter& in, const Value& v, Args& a) { return min_max(in, v, a, true, "max"); }

Value f_replace(Interpreter& in, const Value& v, Args& a) {
  check_args(a, "replace", 3, {"old", "new", "count"});
  std::string old = arg_or(a, 0, "old", Value("")).to_str();
  std::string with = arg_or(a, 1, "new", Value("")).to_str();
  Value count = arg_or(a, 2, "count", Value::none());
  if (!count.is_none() && !count.is_integral()) fail("replace: count must be an integer");
  std::string s = v.to_str();
  if (!old.empty() && with.size() > old.size())
    in.check_size(s.size() + size_t(py::count(s, old)) * (with.size() - old.size()), "string");
  else if (old.empty())
    in.check_size(s.size() + (py::length(s) + 1) * with.size(), "string");
  return Value(py::replace(s, old, with, count.is_none() ? -1 : count.as_int()));
}

Value f_reverse(Interpreter&, const Value& v, Args& a) {
  check_args(a, "reverse", 0, {});
  if (v.is_string()) {
    auto cps = py::decode(v.str());
    std::reverse(cps.begin(), cps.end());
    return Value(py::encode(cps));
  }
  ValueList items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value f_round(Interpreter&, const Value& v, Args& a) {
  check_args(a, "round", 2, {"precision", "method"});
  Value prec = arg_or(a, 0, "precision", Value(0));
  Value method = arg_or(a, 1, "method", Value("common"));
  if (!method.is_string() || (method.str() != "common" && method.str() != "ceil" && method.str() != "floor"))
    fail("method must be common, ceil or floor");
  if (!prec.is_integral()) fail("round: precision must be an integer");
  if (!v.is_number()) fail("type {} doesn't define __round__ method", v.type_name());
  int64_t p = prec.as_int();
  if (method.str() == "common") {
    if (v.is_integral()) return Value(v.as_int());  // round(int, n) stays an int
    double d = v.as_double();
    if (!std::isfinite(d)) return Value(d);
    if (p > 300 || p < -300) return Value(p > 0 ? d : 0.0 * d);
    // Python rounds the exact binary value half-to-even at the decimal digit: printf does the same.
    if (p >= 0) {
      char buf[512];
      std::snprintf(buf, sizeof buf, "%.*f", int(p), d);
      return Value(std::strtod(buf, nullptr));
    }
    double m = std::pow(10.0, double(-p));
    double r = std::nearbyint(d / m) * m;
    return Value(r);
  }
  double m = std::pow(10.0, double(p));
  double d = v.as_double() * m;
  return Value((method.str() == "ceil" ? std::ceil(d) : std::floor(d)) / m);
}

Value f_safe(Interpreter&, const Value& v, Args& a) {
  check_args(a, "safe", 0, {});
  return Value(v.to_str());
}

Value f_sort(Interpreter& in, const Value& v, Args& a) {
  check_args(a, "sort", 3, {"reverse", "case_sensitive", "attribute"});
  bool reverse = arg_or(a, 0, "reverse", Value(false)).truthy();
  bool cs = arg_or(a, 1, "case_sensitive", Value(false)).truthy();
  const Value* attr = find_arg(a, 2, "attribute");
  ValueList items = iterate(v);
  std::vector<Value> keys;
  for (const auto& item : items) {
    Value key = item;
    if (attr && !attr->is_none()) {
      // attribute="a,b" sorts by several attributes.
      auto names = attr->is_string() ? py::split(attr->str(), std::string(","), -1) : std::vector<std::string>{};
      if (names.size() > 1) {
        ValueList parts;
        for (const auto& n : names) parts.push_back(lower_if_str(get_path(in, item, Value(n)), cs));
        keys.push_back(Value::list(std::move(parts)));
        continue;
      }
      key = get_path(in, item, *attr);
    }
    keys.push_back(lower_if_str(key, cs));
  }
  sort_by_key(items, std::move(keys), reverse);
  return Value::list(std::move(items));
}

Value f_string(Interpreter&, const Value& v, Args& a) {
  check_args(a, "string", 0, {});
  return Value(v.to_str());
}

Value f_sum(Interpreter& in, const Value& v, Args& a) {
  check_args(a, "sum", 2, {"attribute", "start"});
  const Value* attr = find_arg(a, 0, "attribute");
  Value acc = arg_or(a, 1, "start", Value(0));
  for (const auto& item : iterate(v))
    acc = binary_op("+", acc, attr && !attr->is_none() ? get_path(in, item, *attr) : item, in);
  return acc;
}

Value f_trim(Interpreter&, const Value& v, Args& a) {
  check_args(a, "trim", 1, {"chars"});
  Value chars = arg_or(a, 0, "chars", Value::none());
  std::optional<std::string> set;
  if (!chars.is_none()) set = chars.to_str();
  return Value(py::strip(v.to_str(), set, true, true));
}

Value f_unique(Interpreter& in, const Value& v, Args& a) {
  check_args(a, "unique", 2, {"case_sensitive", "attribute"});
  bool cs = arg_or(a, 0, "case_sensitive", Value(false)).truthy();
  const Value* attr = find_arg(a, 1, "attribute");
  ValueList out, seen;
  for (const auto& item : iterate(v)) {
    Value key = lower_if_str(attr && !attr->is_none() ? get_path(in, item, *attr) : item, cs);
    bool dup = false;
    for (const auto& s : seen) dup = dup || py_equal(s, key);
    if (!dup) seen.push_back(key), out.push_back(item);
  }
  return Value::list(std::move(out));
}

// len(re.findall(r"\w+", s)): word characters are letters, digits and '_' (non-ASCII letters included).
Value f_wordcount(Interpreter&, const Value& v, Args& a) {
  check_args(a, "wordcount", 0, {});
  int64_t n = 0;
  bool in_word = false;
  for (uint32_t c : py::decode(v.to_str())) {
    bool w = c == '_' || py::is_alpha(c) || py::is_digit(c) ||
             (c >= 0x80 && !py::is_space(c) && !(c >= 0x2000 && c <= 0x2BFF) && !(c >= 0x3000 && c <= 0x303F) &&
              !(c >= 0xFF00 && c <= 0xFF0F) && !(c >= 0x1F000 && c <= 0x1FAFF) && c != 0xA0 && !(c >= 0x80 && c <= 0xBF));
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

// transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) = json.dumps(...)
Value f_tojson(Interpreter& in, const Value& v, Args& a) {
  check_args(a, "tojson", 4, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions opt;
  opt.ensure_ascii = arg_or(a, 0, "ensure_ascii", Value(false)).truthy();
  Value indent = arg_or(a, 1, "indent", Value::none());
  Value seps = arg_or(a, 2, "separators", Value::none());
  opt.sort_keys = arg_or(a, 3, "sort_keys", Value(false)).truthy();
  if (!indent.is_none()) {
    opt.has_indent = true;
    if (indent.is_string()) {
      opt.indent = indent.str();
    } else if (indent.is_integral()) {
      int64_t n = std::min<int64_t>(indent.as_int(), 4096);
      opt.indent = std::string(size_t(std::max<int64_t>(0, n)), ' ');
    } else {
      fail("tojson: indent must be an integer or a string, not {}", indent.type_name());
    }
    opt.item_sep = ",";
  }
  if (!seps.is_none()) {
    if (!seps.is_list() || seps.items().size() != 2 || !seps.items()[0].is_string() || !seps.items()[1].is_string())
      fail("tojson: separators must be a pair of strings");
    opt.item_sep = seps.items()[0].str();
    opt.key_sep = seps.items()[1].str();
  }
  std::string s = to_json_string(v, opt);
  in.check_size(s.size(), "string");
  return Value(std::move(s));
}

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> m = {
      {"abs", f_abs},         {"attr", f_attr},         {"batch", f_batch},     {"capitalize", f_capitalize},
      {"center", f_center},   {"count", f_length},      {"d", f_default},       {"default", f_default},
      {"dictsort", f_dictsort}, {"e", f_escape},        {"escape", f_escape},   {"first", f_first},
      {"float", f_float},     {"indent", f_indent},     {"int", f_int},         {"items", f_items},
      {"join", f_join},       {"last", f_last},         {"length", f_length},   {"list", f_list},
      {"lower", f_lower},     {"map", f_map},           {"max", f_max},         {"min", f_min},
      {"reject", f_reject},   {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse},
      {"round", f_round},     {"safe", f_safe},         {"select", f_select},   {"selectattr", f_selectattr},
      {"sort", f_sort},       {"string", f_string},     {"sum", f_sum},         {"title", f_title},
      {"tojson", f_tojson},   {"trim", f_trim},         {"unique", f_unique},   {"upper", f_upper},
      {"wordcount", f_wordcount},
  };
  return m;
}

}  // namespace

FilterFn find_filter(const std::string& name) {
  auto it = filters().find(name);
  return it == filters().end() ? nullptr : it->second;
}

bool has_filter(const std::string& name) { return find_filter(name) != nullptr; }

}  // namespace arbor::jinja
