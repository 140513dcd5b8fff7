// Jinja interpreter: statements, expressions, scoping, attribute/item lookup and the render limits.
#include "text/jinja/interpreter.h"

#include <cmath>

#include "text/jinja/error.h"
#include "text/jinja/pystr.h"

namespace arbor::jinja {

const Value* Frame::lookup(const std::string& name) const {
  for (const Frame* f = this; f; f = f->parent.get())
    for (const auto& [k, v] : f->vars)
      if (k == name) return &v;
  return nullptr;
}

void Frame::set(const std::string& name, Value v) {
  for (auto& [k, x] : vars)
    if (k == name) {
      x = std::move(v);
      return;
    }
  vars.emplace_back(name, std::move(v));
}

namespace {

struct OutputSwap {
  std::string*& slot;
  std::string* saved;
  OutputSwap(std::string*& s, std::string* with) : slot(s), saved(s) { slot = with; }
  ~OutputSwap() { slot = saved; }
};

[[noreturn]] void undefined_error(const Value& u) {
  fail("{}", u.str().empty() ? std::string("value is undefined") : u.str());
}

std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  return v.type_name() + " object";
}

}  // namespace

// ---------------------------------------------------------------- rendering and statements

std::string Interpreter::render(const Body& body, std::shared_ptr<Frame> globals) {
  std::string out;
  OutputSwap swap(out_, &out);
  auto frame = std::make_shared<Frame>();
  frame->parent = std::move(globals);
  struct BreakCycles {
    Interpreter& in;
    ~BreakCycles() {
      for (auto& f : in.macro_frames_) f->vars.clear();
      for (auto& d : in.namespaces_) d->entries.clear();
      in.macro_frames_.clear();
      in.namespaces_.clear();
    }
  } break_cycles{*this};
  try {
    exec_body(body, frame);
  } catch (const TemplateError&) {
    throw;
  } catch (const arbor::Error& e) {
    throw TemplateError("runtime", name_, line_, col_, e.what());
  }
  return out;
}

void Interpreter::too_much_work() {
  fail("template did more than {} steps of work (a runaway loop?)", limits_.max_steps);
}

void Interpreter::check_size(size_t bytes, const char* what) const {
  if (bytes > limits_.max_output) fail("{} of {} bytes exceeds the limit of {} bytes", what, bytes, limits_.max_output);
}

void Interpreter::emit(const std::string& s) {
  check_size(out_->size() + s.size(), "output");
  out_->append(s);
}

void Interpreter::raise_from_template(const std::string& msg) { throw TemplateError("raised", name_, line_, col_, msg); }

std::string Interpreter::capture(const Body& body, const std::shared_ptr<Frame>& frame) {
  std::string buf;
  OutputSwap swap(out_, &buf);
  exec_body(body, frame);
  return buf;
}

Interpreter::Flow Interpreter::exec_body(const Body& body, const std::shared_ptr<Frame>& frame) {
  for (const auto& s : body) {
    Flow f = exec(*s, frame);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s, const std::shared_ptr<Frame>& frame) {
  tick();
  at(s.line, s.col);
  switch (s.kind) {
    case StmtKind::Output: emit(s.text); break;
    case StmtKind::Print: {
      Value v = eval(*s.expr, frame);
      emit(v.to_str());
      break;
    }
    case StmtKind::If: {
      for (const auto& [cond, body] : s.branches)
        if (eval(*cond, frame).truthy()) return exec_body(body, frame);
      return exec_body(s.else_body, frame);
    }
    case StmtKind::For: exec_for(s, frame); break;
    case StmtKind::Set: {
      Value v = eval(*s.expr, frame);
      at(s.line, s.col);
      assign(*s.target, v, *frame, frame);
      break;
    }
    case StmtKind::SetBlock:
    case StmtKind::FilterBlock: {
      Value v(capture(s.body, frame));
      if (s.filter) {
        // The chain's innermost Filter has no operand: it receives the captured text.
        std::vector<const Expr*> chain;
        for (const Expr* f = s.filter.get(); f; f = f->a.get()) chain.push_back(f);
        for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
          CallArgs args;
          eval_args(**it, frame, args);
          at((*it)->line, (*it)->col);
          v = filter((*it)->name, v, args);
        }
      }
      if (s.kind == StmtKind::SetBlock) {
        assign(*s.target, v, *frame, frame);
      } else {
        emit(v.to_str());
      }
      break;
    }
    case StmtKind::Macro:
      frame->set(s.name, make_macro(s, frame, false));
      macro_frames_.push_back(frame);
      break;
    case StmtKind::CallBlock: {
      Value caller = make_macro(s, frame, true);
      Value v = eval_call(*s.expr, frame, &caller);
      emit(v.to_str());
      break;
    }
    case StmtKind::With: {
      auto f = std::make_shared<Frame>();
      f->parent = frame;
      for (const auto& [target, value] : s.assigns) assign(*target, eval(*value, frame), *f, f);
      return exec_body(s.body, f);
    }
    case StmtKind::Break: return Flow::Break;
    case StmtKind::Continue: return Flow::Continue;
    case StmtKind::Generation: return exec_body(s.body, frame);
  }
  return Flow::Normal;
}

void Interpreter::assign(const Expr& target, const Value& v, Frame& frame, const std::shared_ptr<Frame>& scope) {
  if (target.kind == ExprKind::Name) {
    frame.set(target.name, v);
    return;
  }
  if (target.kind == ExprKind::GetAttr) {  // {% set ns.attr = v %}
    const Value* ns = scope->lookup(target.a->name);
    if (!ns || !ns->is_namespace()) fail("cannot assign attribute on non-namespace object");
    ns->dict_mut().set(Value(target.name), v);
    return;
  }
  // Tuple unpacking.
  if (!(v.is_list() || v.is_dict() || v.is_string() || v.is_undefined()))
    fail("cannot unpack non-iterable {} object", v.type_name());
  ValueList items = iterate(v);
  if (items.size() < target.args.size())
    fail("not enough values to unpack (expected {}, got {})", target.args.size(), items.size());
  if (items.size() > target.args.size()) fail("too many values to unpack (expected {})", target.args.size());
  for (size_t i = 0; i < items.size(); ++i) assign(*target.args[i], items[i], frame, scope);
}

void Interpreter::exec_for(const Stmt& s, const std::shared_ptr<Frame>& frame) {
  Value seq = eval(*s.expr, frame);
  at(s.line, s.col);
  if (!(seq.is_list() || seq.is_dict() || seq.is_string() || seq.is_undefined()))
    fail("'{}' object is not iterable", seq.type_name());
  ValueList items = iterate(seq);
  if (s.cond) {
    ValueList kept;
    for (auto& item : items) {
      tick();
      auto f = std::make_shared<Frame>();
      f->parent = frame;
      assign(*s.target, item, *f, f);
      if (eval(*s.cond, f).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    auto f = std::make_shared<Frame>();
    f->parent = frame;
    exec_body(s.else_body, f);
    return;
  }
  const int64_t n = int64_t(items.size());
  auto index = std::make_shared<int64_t>(0);
  Value cycle = Value::callable("cycle", [index](Interpreter&, CallArgs& a) -> Value {
    if (a.pos.empty()) fail("no items for cycling given");
    return a.pos[size_t(*index % int64_t(a.pos.size()))];
  });
  auto last_changed = std::make_shared<std::optional<ValueList>>();
  Value changed = Value::callable("changed", [last_changed](Interpreter&, CallArgs& a) -> Value {
    if (*last_changed && last_changed->value().size() == a.pos.size()) {
      bool same = true;
      for (size_t i = 0; i < a.pos.size(); ++i) same = same && py_equal(a.pos[i], (**last_changed)[i]);
      if (same) return Value(false);
    }
    *last_changed = a.pos;
    return Value(true);
  });
  for (int64_t i = 0; i < n; ++i) {
    tick();
    *index = i;
    auto loop = std::make_shared<Dict>();
    auto put = [&](const char* k, Value v) { loop->entries.emplace_back(Value(k), std::move(v)); };
    put("index", Value(i + 1));
    put("index0", Value(i));
    put("revindex", Value(n - i));
    put("revindex0", Value(n - i - 1));
    put("first", Value(i == 0));
    put("last", Value(i == n - 1));
    put("length", Value(n));
    put("depth", Value(1));
    put("depth0", Value(0));
    if (i > 0) put("previtem", items[size_t(i - 1)]);
    if (i + 1 < n) put("nextitem", items[size_t(i + 1)]);
    put("cycle", cycle);
    put("changed", changed);
    auto f = std::make_shared<Frame>();
    f->parent = frame;
    f->vars.reserve(4);
    assign(*s.target, items[size_t(i)], *f, f);
    f->set("loop", Value::dict(std::move(loop)));
    if (exec_body(s.body, f) == Flow::Break) break;
  }
}

Value Interpreter::make_macro(const Stmt& s, const std::shared_ptr<Frame>& frame, bool is_caller) {
  const Stmt* def = &s;
  std::shared_ptr<Frame> closure = frame;
  std::string name = is_caller ? "caller" : s.name;
  return Value::callable(name, [def, closure, name](Interpreter& in, CallArgs& a) -> Value {
    if (++in.call_depth_ > in.limits_.max_call_depth) {
      --in.call_depth_;
      fail("maximum recursion depth of {} macro calls exceeded", in.limits_.max_call_depth);
    }
    struct Depth {
      int& d;
      ~Depth() { --d; }
    } depth{in.call_depth_};
    auto f = std::make_shared<Frame>();
    f->parent = closure;
    const auto& params = def->params;
    std::vector<bool> bound(params.size(), false);
    for (size_t i = 0; i < params.size() && i < a.pos.size(); ++i) f->set(params[i].name, a.pos[i]), bound[i] = true;
    ValueList varargs;
    for (size_t i = params.size(); i < a.pos.size(); ++i) varargs.push_back(a.pos[i]);
    auto kwargs = std::make_shared<Dict>();
    for (const auto& [k, v] : a.kw) {
      size_t j = 0;
      while (j < params.size() && params[j].name != k) ++j;
      if (j < params.size()) {
        if (bound[j]) fail("macro '{}' got multiple values for argument '{}'", name, k);
        f->set(k, v), bound[j] = true;
      } else if (k == "caller") {
        f->set("caller", v);
      } else {
        kwargs->entries.emplace_back(Value(k), v);
      }
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (bound[i]) continue;
      if (params[i].default_value) {
        f->set(params[i].name, in.eval(*params[i].default_value, f));
      } else {
        f->set(params[i].name, Value::undefined(fmt::format("parameter '{}' was not provided", params[i].name)));
      }
    }
    f->set("varargs", Value::list(std::move(varargs), true));
    f->set("kwargs", Value::dict(std::move(kwargs)));
    return Value(in.capture(def->body, f));
  });
}

// ---------------------------------------------------------------- expressions

Value Interpreter::eval(const Expr& e, const std::shared_ptr<Frame>& frame) {
  tick();
  at(e.line, e.col);
  switch (e.kind) {
    case ExprKind::Const: return e.value;
    case ExprKind::Name: {
      const Value* v = frame->lookup(e.name);
      return v ? *v : Value::undefined(fmt::format("'{}' is undefined", e.name));
    }
    case ExprKind::List:
    case ExprKind::Tuple: {
      ValueList items;
      items.reserve(e.args.size());
      for (const auto& x : e.args) items.push_back(eval(*x, frame));
      return Value::list(std::move(items), e.kind == ExprKind::Tuple);
    }
    case ExprKind::Dict: {
      auto d = std::make_shared<Dict>();
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value k = eval(*e.args[i], frame);
        if (k.is_list() && !k.is_tuple()) fail("unhashable type: 'list'");
        if (k.is_dict()) fail("unhashable type: 'dict'");
        d->set(k, eval(*e.args[i + 1], frame));
      }
      return Value::dict(std::move(d));
    }
    case ExprKind::GetAttr: {
      Value obj = eval(*e.a, frame);
      at(e.line, e.col);
      return get_attr(obj, e.name);
    }
    case ExprKind::GetItem: {
      Value obj = eval(*e.a, frame);
      Value key = eval(*e.b, frame);
      at(e.line, e.col);
      return get_item(obj, key);
    }
    case ExprKind::Slice: {
      Value obj = eval(*e.a, frame);
      Value parts[3];
      for (int i = 0; i < 3; ++i)
        parts[i] = e.args[size_t(i)] ? eval(*e.args[size_t(i)], frame) : Value::none();
      at(e.line, e.col);
      if (obj.is_undefined()) undefined_error(obj);
      return slice(obj, parts[0], parts[1], parts[2]);
    }
    case ExprKind::Call: return eval_call(e, frame, nullptr);
    case ExprKind::Filter: {
      Value operand = e.a ? eval(*e.a, frame) : Value::undefined();
      CallArgs args;
      eval_args(e, frame, args);
      at(e.line, e.col);
      return filter(e.name, operand, args);
    }
    case ExprKind::Test: {
      Value operand = eval(*e.a, frame);
      CallArgs args;
      eval_args(e, frame, args);
      at(e.line, e.col);
      return Value(test(e.name, operand, args));
    }
    case ExprKind::Unary: {
      Value v = eval(*e.a, frame);
      at(e.line, e.col);
      if (e.name == "not") return Value(!v.truthy());
      if (v.is_undefined()) undefined_error(v);
      if (!v.is_number()) fail("bad operand type for unary {}: '{}'", e.name, v.type_name());
      if (e.name == "+") return v.is_bool() ? Value(v.as_int()) : v;
      if (v.is_float()) return Value(-v.as_double());
      if (v.as_int() == INT64_MIN) fail("integer overflow");
      return Value(-v.as_int());
    }
    case ExprKind::Binary: return eval_binary(e, frame);
    case ExprKind::Compare: return eval_compare(e, frame);
    case ExprKind::CondExpr: {
      if (eval(*e.b, frame).truthy()) return eval(*e.a, frame);
      if (e.c) return eval(*e.c, frame);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.line) + " evaluated to false and no else section was defined.");
    }
  }
  return Value();
}

void Interpreter::eval_args(const Expr& e, const std::shared_ptr<Frame>& frame, CallArgs& out, size_t skip_pos) {
  for (size_t i = skip_pos; i < e.args.size(); ++i) out.pos.push_back(eval(*e.args[i], frame));
  for (const auto& [k, x] : e.kwargs) {
    Value v = eval(*x, frame);
    if (k == "*") {
      if (!(v.is_list() || v.is_dict() || v.is_string() || v.is_undefined())) fail("argument after * must be an iterable, not {}", v.type_name());
      for (auto& item : iterate(v)) out.pos.push_back(std::move(item));
    } else if (k == "**") {
      if (!v.is_dict()) fail("argument after ** must be a mapping, not {}", v.type_name());
      for (const auto& [dk, dv] : v.dict_ref().entries) {
        if (!dk.is_string()) fail("keywords must be strings");
        out.kw.emplace_back(dk.str(), dv);
      }
    } else {
      out.kw.emplace_back(k, std::move(v));
    }
  }
}

Value Interpreter::eval_call(const Expr& e, const std::shared_ptr<Frame>& frame, const Value* caller) {
  // obj.method(...) on str/list/dict dispatches straight to the method (Python attributes win over keys).
  if (e.a->kind == ExprKind::GetAttr) {
    Value obj = eval(*e.a->a, frame);
    at(e.a->line, e.a->col);
    if (obj.is_undefined()) undefined_error(obj);
    if (has_method(obj, e.a->name)) {
      if (is_unsafe_method(obj, e.a->name))
        fail("access to attribute '{}' of '{}' object is unsafe.", e.a->name, obj.type_name());
      CallArgs args;
      eval_args(e, frame, args);
      if (caller) args.kw.emplace_back("caller", *caller);
      at(e.line, e.col);
      return call_method(*this, obj, e.a->name, args);
    }
    Value fn = get_attr(obj, e.a->name);
    CallArgs args;
    eval_args(e, frame, args);
    if (caller) args.kw.emplace_back("caller", *caller);
    at(e.line, e.col);
    return call(fn, args);
  }
  Value fn = eval(*e.a, frame);
  CallArgs args;
  eval_args(e, frame, args);
  if (caller) args.kw.emplace_back("caller", *caller);
  at(e.line, e.col);
  return call(fn, args);
}

Value Interpreter::call(const Value& fn, CallArgs& args) {
  if (fn.is_undefined()) undefined_error(fn);
  if (!fn.is_callable()) fail("'{}' object is not callable", fn.type_name());
  return fn.fn().fn(*this, args);
}

Value Interpreter::eval_binary(const Expr& e, const std::shared_ptr<Frame>& frame) {
  if (e.name == "and" || e.name == "or") {
    Value l = eval(*e.a, frame);
    if (l.truthy() == (e.name == "or")) return l;
    return eval(*e.b, frame);
  }
  Value l = eval(*e.a, frame);
  Value r = eval(*e.b, frame);
  at(e.line, e.col);
  return binary_op(e.name, l, r, *this);
}

Value Interpreter::eval_compare(const Expr& e, const std::shared_ptr<Frame>& frame) {
  Value l = eval(*e.a, frame);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value r = eval(*e.args[i], frame);
    at(e.line, e.col);
    const std::string& op = e.ops[i];
    bool res;
    if (op == "==") {
      res = py_equal(l, r);
    } else if (op == "!=") {
      res = !py_equal(l, r);
    } else if (op == "in" || op == "notin") {
      if (r.is_undefined()) {
        res = false;
      } else {
        if (!(r.is_list() || r.is_dict() || r.is_string() || r.is_namespace()))
          fail("argument of type '{}' is not iterable", r.type_name());
        if (r.is_string() && !l.is_string())
          fail("'in <string>' requires string as left operand, not {}", l.type_name());
        res = contains(r, l);
      }
      if (op == "notin") res = !res;
    } else {
      if (l.is_undefined()) undefined_error(l);
      if (r.is_undefined()) undefined_error(r);
      bool ok;
      bool lt = op == "<" || op == ">=" ? py_less(l, r, &ok) : py_less(r, l, &ok);
      if (!ok) fail("'{}' not supported between instances of '{}' and '{}'", op, l.type_name(), r.type_name());
      if (op == "<" || op == ">") {
        res = lt;
      } else {
        res = !lt;  // a <= b == !(b < a); a >= b == !(a < b)
        if (l.is_float() || r.is_float()) {
          // NaN compares false both ways.
          double x = l.as_double(), y = r.as_double();
          if ((l.is_number() && r.is_number()) && (std::isnan(x) || std::isnan(y))) res = false;
        }
      }
    }
    if (!res) return Value(false);
    l = std::move(r);
  }
  return Value(true);
}

// ---------------------------------------------------------------- lookup

Value Interpreter::get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) undefined_error(obj);
  if (has_method(obj, name)) {
    if (is_unsafe_method(obj, name))
      return Value::undefined(fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, obj.type_name()));
    Value self = obj;
    std::string method = name;
    return Value::callable(name, [self, method](Interpreter& in, CallArgs& a) { return call_method(in, self, method, a); });
  }
  if (obj.is_dict() || obj.is_namespace()) {
    if (const Value* v = obj.dict_ref().find(name)) return *v;
  }
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", object_type_repr(obj), name));
}

Value Interpreter::get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.is_dict()) {
    if (const Value* v = obj.dict_ref().find(key)) return *v;
  } else if ((obj.is_list() || obj.is_string()) && key.is_integral()) {
    int64_t n = obj.is_list() ? int64_t(obj.items().size()) : int64_t(py::length(obj.str()));
    int64_t i = key.as_int();
    if (i < 0) i += n;
    if (i >= 0 && i < n) {
      if (obj.is_list()) return obj.items()[size_t(i)];
      if (py::is_ascii(obj.str())) return Value(obj.str().substr(size_t(i), 1));
      std::string ch;
      py::append_utf8(ch, py::decode(obj.str())[size_t(i)]);
      return Value(ch);
    }
    return Value::undefined(fmt::format("{} has no element {}", object_type_repr(obj), key.repr()));
  }
  if (key.is_string()) return get_attr(obj, key.str());
  return Value::undefined(fmt::format("{} has no element {}", object_type_repr(obj), key.repr()));
}

Value Interpreter::filter(const std::string& name, Value operand, CallArgs& args) {
  FilterFn f = find_filter(name);
  if (!f) fail("No filter named '{}'.", name);
  return f(*this, operand, args);
}

bool Interpreter::test(const std::string& name, const Value& operand, CallArgs& args) {
  TestFn t = find_test(name);
  if (!t) fail("No test named '{}'.", name);
  return t(*this, operand, args);
}

}  // namespace arbor::jinja
