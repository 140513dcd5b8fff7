// Verb registry: each src/cli/cmd_*.cpp registers its verbs with ARBOR_VERB; main.cpp dispatches.
#pragma once
#include <string>
#include <vector>

namespace arbor::cli {

using VerbFn = int (*)(const std::vector<std::string>& args);  // args exclude the verb itself

struct Verb {
  const char* name;
  const char* summary;  // one line for `arbor help`
  VerbFn fn;
};

std::vector<Verb>& verbs();
struct VerbRegistrar {
  VerbRegistrar(const char* name, const char* summary, VerbFn fn) { verbs().push_back({name, summary, fn}); }
};

}  // namespace arbor::cli

#define ARBOR_VERB_CAT2(a, b) a##b
#define ARBOR_VERB_CAT(a, b) ARBOR_VERB_CAT2(a, b)
#define ARBOR_VERB(name, summary, fn) \
  static ::arbor::cli::VerbRegistrar ARBOR_VERB_CAT(arbor_verb_, __LINE__)(name, summary, fn)
