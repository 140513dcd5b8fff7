// Args: a small flag parser for verbs ("--name value", "--name=value", "--flag", positionals).
// Unknown flags are errors that name the flag and list the known ones; --help or -h in a flag's place
// throws HelpRequested, which main.cpp turns into the verb's help.
#pragma once
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace arbor::cli {

// Thrown by Args on --help / -h: the flags the verb accepts, for main.cpp to check its help against.
struct HelpRequested {
  std::set<std::string> value_flags, bool_flags;
};

class Args {
 public:
  // value_flags take a value; bool_flags do not. Throws arbor::Error on an unknown flag, HelpRequested
  // on --help / -h.
  Args(const std::vector<std::string>& args, const std::set<std::string>& value_flags, const std::set<std::string>& bool_flags);
  bool has(const std::string& flag) const { return values_.count(flag) != 0; }
  std::optional<std::string> get(const std::string& flag) const;
  std::string get_or(const std::string& flag, const std::string& def) const;
  int64_t get_int(const std::string& flag, int64_t def) const;    // throws naming the flag on a bad number
  double get_double(const std::string& flag, double def) const;  // likewise
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

}  // namespace arbor::cli
