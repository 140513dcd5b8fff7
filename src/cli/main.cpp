// arbor: the command-line entry point. Verbs live in src/cli/cmd_*.cpp and register themselves;
// `arbor help` lists them, `arbor VERB --help` (or `arbor help VERB`) describes one's flags.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <exception>
#include <set>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/build_info.h"
#include "cli/verb.h"

namespace arbor::cli {
std::vector<Verb>& verbs() {
  static std::vector<Verb> v;
  return v;
}
}  // namespace arbor::cli

namespace {

using arbor::cli::Verb;

int usage() {
  auto vs = arbor::cli::verbs();
  std::sort(vs.begin(), vs.end(), [](auto& a, auto& b) { return std::string(a.name) < b.name; });
  std::printf("usage: arbor <verb> [flags]   (no verb: arbor serve)\n\nverbs:\n");
  for (const auto& v : vs) std::printf("  %-16s %s\n", v.name, v.summary);
  std::printf("\narbor <verb> --help describes a verb's flags; arbor --version names the build.\n");
  return 0;
}

// The flags a help text describes: every line that starts with two spaces and "--name" (continuation
// lines are indented further).
std::set<std::string> described_flags(const std::string& text) {
  std::set<std::string> out;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    if (text.compare(pos, 4, "  --") == 0) {
      size_t stop = pos + 4;
      while (stop < end && (std::isalnum(static_cast<unsigned char>(text[stop])) || text[stop] == '-')) ++stop;
      out.insert(text.substr(pos + 4, stop - pos - 4));
    }
    pos = end + 1;
  }
  return out;
}

// `arbor VERB --help`. A flag the verb accepts but its help leaves out (or the reverse) is a bug in
// the help text: named on stderr, so the CLI test fails on it.
int verb_help(const Verb& v, const arbor::cli::HelpRequested& h) {
  std::printf("usage: arbor %s %s\n%s\n\nflags:\n%s", v.name, v.usage, v.summary, v.flags);
  std::printf("  --help, -h            this text\n");
  std::set<std::string> accepted = h.value_flags;
  accepted.insert(h.bool_flags.begin(), h.bool_flags.end());
  const std::set<std::string> described = described_flags(v.flags);
  for (const auto& f : accepted)
    if (!described.count(f)) std::fprintf(stderr, "arbor %s --help: the flag --%s is accepted but not described\n", v.name, f.c_str());
  for (const auto& f : described)
    if (f != "help" && !accepted.count(f)) std::fprintf(stderr, "arbor %s --help: --%s is described but not accepted\n", v.name, f.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string verb = "serve";
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) return usage();
  if (!args.empty() && (args[0] == "--version" || args[0] == "version")) {
    std::printf("arbor %s\n%s\n", arbor::build_commit(), arbor::build_config());
    return 0;
  }
  if (!args.empty() && args[0].rfind("-", 0) != 0) {
    verb = args[0];
    args.erase(args.begin());
  }
  if (verb == "help") {
    if (args.empty()) return usage();
    verb = args[0];  // arbor help VERB: that verb's --help
    args = {"--help"};
  }
  for (const auto& v : arbor::cli::verbs()) {
    if (verb != v.name) continue;
    try {
      return v.fn(args);
    } catch (const arbor::cli::HelpRequested& h) {
      return verb_help(v, h);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "arbor %s: %s\n", v.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "arbor: unknown verb '%s' (arbor help lists them)\n", verb.c_str());
  return 2;
}
