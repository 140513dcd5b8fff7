// arbor: the command-line entry point; dispatches to one function per verb.
#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  std::string verb = argc > 1 ? argv[1] : "help";
  std::printf("arbor: verb '%s' not available yet\n", verb.c_str());
  return verb == "help" ? 0 : 2;
}
