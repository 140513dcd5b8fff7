// Jinja interpreter: walks the AST with Jinja2's scoping (a frame per loop iteration, macro closures),
// Jinja2's default Undefined semantics, and limits on work, output size and call depth.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "text/jinja/ast.h"
#include "text/jinja/value.h"

namespace arbor::jinja {

struct RenderLimits {
  int64_t max_steps = 5'000'000;          // statements + expressions evaluated (about 1 s)
  size_t max_output = size_t(64) << 20;   // bytes of output, and of any one string built
  int max_call_depth = 64;                // nested macro/caller calls
};

struct Frame {
  std::vector<std::pair<std::string, Value>> vars;
  std::shared_ptr<Frame> parent;
  const Value* lookup(const std::string& name) const;
  void set(const std::string& name, Value v);
};

class Interpreter {
 public:
  Interpreter(std::string name, RenderLimits limits) : name_(std::move(name)), limits_(limits) {}

  // Renders body with `globals` as the outermost frame. Throws TemplateError with line and column.
  std::string render(const Body& body, std::shared_ptr<Frame> globals);

  // For builtins. Errors thrown as arbor::Error get the current line and column attached.
  Value call(const Value& fn, CallArgs& args);
  Value get_attr(const Value& obj, const std::string& name);
  Value get_item(const Value& obj, const Value& key);
  Value filter(const std::string& name, Value operand, CallArgs& args);
  bool test(const std::string& name, const Value& operand, CallArgs& args);
  [[noreturn]] void raise_from_template(const std::string& msg);  // raise_exception()
  void check_size(size_t bytes, const char* what) const;
  void tick() {
    if (++steps_ > limits_.max_steps) too_much_work();
  }
  const RenderLimits& limits() const { return limits_; }
  // Namespaces are mutable and can end up containing themselves; render() empties the ones it saw
  // when it finishes so that such reference cycles are freed.
  void track_namespace(const std::shared_ptr<Dict>& d) { namespaces_.push_back(d); }

 private:
  enum class Flow { Normal, Break, Continue };

  Flow exec_body(const Body& body, const std::shared_ptr<Frame>& frame);
  Flow exec(const Stmt& s, const std::shared_ptr<Frame>& frame);
  void exec_for(const Stmt& s, const std::shared_ptr<Frame>& frame);
  void assign(const Expr& target, const Value& v, Frame& frame, const std::shared_ptr<Frame>& scope);
  Value eval(const Expr& e, const std::shared_ptr<Frame>& frame);
  Value eval_binary(const Expr& e, const std::shared_ptr<Frame>& frame);
  Value eval_compare(const Expr& e, const std::shared_ptr<Frame>& frame);
  Value eval_call(const Expr& e, const std::shared_ptr<Frame>& frame, const Value* caller);
  void eval_args(const Expr& e, const std::shared_ptr<Frame>& frame, CallArgs& out, size_t skip_pos = 0);
  Value make_macro(const Stmt& s, const std::shared_ptr<Frame>& frame, bool is_caller);
  std::string capture(const Body& body, const std::shared_ptr<Frame>& frame);
  void emit(const std::string& s);
  void at(int line, int col) { line_ = line, col_ = col; }
  [[noreturn]] void too_much_work();

  std::string name_;
  RenderLimits limits_;
  std::string* out_ = nullptr;
  int64_t steps_ = 0;
  size_t emitted_ = 0;
  int call_depth_ = 0;
  int line_ = 1, col_ = 1;
  // A macro value holds its defining frame, which holds the macro: render() clears these frames at the
  // end to break the cycle.
  std::vector<std::shared_ptr<Frame>> macro_frames_;
  std::vector<std::shared_ptr<Dict>> namespaces_;
};

// Iterating a value as Jinja does: lists/tuples, dict keys, string characters, undefined = empty.
ValueList iterate(const Value& v);
Value binary_op(const std::string& op, const Value& a, const Value& b, const Interpreter& in);
bool contains(const Value& container, const Value& item);  // Python `in`
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// Builtins (filters.cpp, tests.cpp, methods.cpp, globals.cpp).
using FilterFn = Value (*)(Interpreter&, const Value& operand, CallArgs& args);
using TestFn = bool (*)(Interpreter&, const Value& operand, CallArgs& args);
FilterFn find_filter(const std::string& name);
TestFn find_test(const std::string& name);
// Python methods of str, list and dict. `found` = false when the type has no such method.
bool has_method(const Value& obj, const std::string& name);
bool is_unsafe_method(const Value& obj, const std::string& name);  // mutators the sandbox refuses
Value call_method(Interpreter& in, const Value& obj, const std::string& name, CallArgs& args);
void add_globals(Frame& frame);

// Argument helpers for builtins: positional index or keyword name, else the default.
const Value* find_arg(const CallArgs& a, size_t index, const char* name);
Value arg_or(const CallArgs& a, size_t index, const char* name, Value def);
// Fails naming `fn` when more than max_pos positional arguments or a keyword not in `names` is given.
void check_args(const CallArgs& a, const char* fn, size_t max_pos, std::initializer_list<const char*> names);

}  // namespace arbor::jinja
