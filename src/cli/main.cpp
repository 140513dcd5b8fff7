// arbor: the command-line entry point. Verbs live in src/cli/cmd_*.cpp and register themselves.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli/verb.h"

namespace arbor::cli {
std::vector<Verb>& verbs() {
  static std::vector<Verb> v;
  return v;
}
}  // namespace arbor::cli

static int usage() {
  auto vs = arbor::cli::verbs();
  std::sort(vs.begin(), vs.end(), [](auto& a, auto& b) { return std::string(a.name) < b.name; });
  std::printf("usage: arbor <verb> [flags]   (no verb: arbor serve)\n\nverbs:\n");
  for (const auto& v : vs) std::printf("  %-12s %s\n", v.name, v.summary);
  return 0;
}

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string verb = "serve";
  if (!args.empty() && args[0].rfind("-", 0) != 0) {
    verb = args[0];
    args.erase(args.begin());
  }
  if (verb == "help" || verb == "--help" || verb == "-h") return usage();
  for (const auto& v : arbor::cli::verbs()) {
    if (verb != v.name) continue;
    try {
      return v.fn(args);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "arbor %s: %s\n", v.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "arbor: unknown verb '%s' (arbor help lists them)\n", verb.c_str());
  return 2;
}
