// Flag parsing for verbs.
#include "cli/args.h"

#include <charconv>

#include "core/error.h"

namespace arbor::cli {

Args::Args(const std::vector<std::string>& args, const std::set<std::string>& value_flags, const std::set<std::string>& bool_flags) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") throw HelpRequested{value_flags, bool_flags};
    if (a.size() < 3 || a.rfind("--", 0) != 0) {
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    bool inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1), name = name.substr(0, eq), inline_value = true;
    }
    if (value_flags.count(name)) {
      if (!inline_value) {
        if (i + 1 >= args.size()) fail("arguments: --{} needs a value", name);
        value = args[++i];
      }
      values_[name] = value;
    } else if (bool_flags.count(name)) {
      values_[name] = inline_value ? value : "1";
    } else {
      std::string known;
      for (const auto& f : value_flags) known += " --" + f;
      for (const auto& f : bool_flags) known += " --" + f;
      fail("arguments: unknown flag --{}; known:{} (--help describes them)", name, known);
    }
  }
}

std::optional<std::string> Args::get(const std::string& flag) const {
  auto it = values_.find(flag);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string Args::get_or(const std::string& flag, const std::string& def) const { return get(flag).value_or(def); }

int64_t Args::get_int(const std::string& flag, int64_t def) const {
  auto v = get(flag);
  if (!v) return def;
  int64_t out = 0;
  auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), out);
  if (ec != std::errc() || p != v->data() + v->size()) fail("arguments: --{} expects an integer, got '{}'", flag, *v);
  return out;
}

double Args::get_double(const std::string& flag, double def) const {
  auto v = get(flag);
  if (!v) return def;
  try {
    size_t pos = 0;
    double d = std::stod(*v, &pos);
    if (pos != v->size()) throw std::invalid_argument("trailing");
    return d;
  } catch (const std::exception&) {
    fail("arguments: --{} expects a number, got '{}'", flag, *v);
  }
}

}  // namespace arbor::cli
