#include "tools/cli_app.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "common/error.h"
#include "tools/command.h"

namespace gptoss::tools {

std::vector<Command>& command_registry() {
  static std::vector<Command> r;
  return r;
}

std::string version_string() {
#ifdef GPTOSS_HAVE_CUDA
  return "gptoss 0.1.0 (cuda: yes)";
#else
  return "gptoss 0.1.0 (cuda: no)";
#endif
}

void build_app(CLI::App& app, std::map<CLI::App*, std::function<int()>>& runners) {
  app.description("gptoss: inference engine and OpenAI-compatible server for gpt-oss");
  app.name("gptoss");
  app.require_subcommand(1);
  app.footer("Run 'gptoss help COMMAND' (or 'gptoss COMMAND --help') for a command's options; "
             "'gptoss --version' for the version.");
  auto& reg = command_registry();
  std::sort(reg.begin(), reg.end(), [](auto& a, auto& b) { return a.name < b.name; });
  for (auto& c : reg) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    runners[sub] = c.setup(sub);
  }
}

namespace {

std::string command_list() {
  std::string s;
  for (const auto& c : command_registry()) s += (s.empty() ? "" : ", ") + c.name;
  return s;
}

int unknown_command(const std::string& name) {
  std::fprintf(stderr, "error: unknown command \"%s\"\ncommands: %s, help\nRun 'gptoss --help' for what each does.\n",
               name.c_str(), command_list().c_str());
  return 2;
}

bool is_command(const std::string& name) {
  for (const auto& c : command_registry())
    if (c.name == name) return true;
  return false;
}

}  // namespace

int run_cli(int argc, const char* const* argv) {
  CLI::App app;
  std::map<CLI::App*, std::function<int()>> runners;
  build_app(app, runners);
  if (argc < 2) {
    std::fprintf(stderr, "%s\nerror: no command given\n", app.help().c_str());
    return 2;
  }
  std::string first = argv[1];
  if (first == "--version" || first == "-V") {
    std::printf("%s\n", version_string().c_str());
    return 0;
  }
  if (first == "help") {
    if (argc == 2) {
      std::fputs(app.help().c_str(), stdout);
      return 0;
    }
    if (argc > 3) {
      std::fprintf(stderr, "error: 'gptoss help' takes one command name\n");
      return 2;
    }
    if (std::strcmp(argv[2], "help") == 0) {
      std::fputs(app.help().c_str(), stdout);
      return 0;
    }
    if (!is_command(argv[2])) return unknown_command(argv[2]);
    std::fputs(app.get_subcommand(argv[2])->help().c_str(), stdout);
    return 0;
  }
  if (first.empty() || (first[0] != '-' && !is_command(first))) return unknown_command(first);
  if (first[0] == '-' && first != "-h" && first != "--help") {
    std::fprintf(stderr, "error: unknown option \"%s\" (options go after the command: gptoss COMMAND [OPTIONS])\n"
                 "commands: %s, help\n", first.c_str(), command_list().c_str());
    return 2;
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string where = "gptoss";
    for (CLI::App* sub : app.get_subcommands())
      if (sub->parsed()) where += " " + sub->get_name();
    std::fprintf(stderr, "error: %s\nRun '%s --help' for the options.\n", e.what(), where.c_str());
    return 2;
  }
  try {
    for (auto& [sub, run] : runners)
      if (sub->parsed()) return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace gptoss::tools
