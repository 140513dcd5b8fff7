// Verb registry: each src/cli/cmd_*.cpp registers its verbs with ARBOR_VERB; main.cpp dispatches and
// prints `arbor help` (every verb's summary) and `arbor VERB --help` (its flags' lines).
#pragma once
#include <string>
#include <vector>

namespace arbor::cli {

using VerbFn = int (*)(const std::vector<std::string>& args);  // args exclude the verb itself

struct Verb {
  const char* name;
  const char* summary;  // one line for `arbor help`
  // For `arbor VERB --help`: what the verb takes besides flags ("--model DIR \"text\""), then one line
  // per flag, each starting "  --flag", continuation lines indented further. main.cpp checks the flags
  // named here against those the verb's Args accepts and reports any difference.
  const char* usage;
  const char* flags;
  VerbFn fn;
};

std::vector<Verb>& verbs();
struct VerbRegistrar {
  VerbRegistrar(const Verb& v) { verbs().push_back(v); }
};

}  // namespace arbor::cli

#define ARBOR_VERB_CAT2(a, b) a##b
#define ARBOR_VERB_CAT(a, b) ARBOR_VERB_CAT2(a, b)
#define ARBOR_VERB(name, summary, usage, flags, fn) \
  static ::arbor::cli::VerbRegistrar ARBOR_VERB_CAT(arbor_verb_, __LINE__)(::arbor::cli::Verb{name, summary, usage, flags, fn})
