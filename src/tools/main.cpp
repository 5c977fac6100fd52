// The `gptoss` program: one binary, one subcommand per cmd_*.cpp file.
#include <cstdio>
#include <map>

#include "common/error.h"
#include "tools/command.h"

namespace gptoss::tools {
std::vector<Command>& command_registry() {
  static std::vector<Command> r;
  return r;
}
}  // namespace gptoss::tools

int main(int argc, char** argv) {
  using namespace gptoss::tools;
  CLI::App app{"gptoss: inference engine and OpenAI-compatible server for gpt-oss"};
  app.require_subcommand(1);
  std::map<CLI::App*, std::function<int()>> runners;
  auto& reg = command_registry();
  std::sort(reg.begin(), reg.end(), [](auto& a, auto& b) { return a.name < b.name; });
  for (auto& c : reg) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    runners[sub] = c.setup(sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, run] : runners)
      if (sub->parsed()) return run();
  } catch (const gptoss::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
