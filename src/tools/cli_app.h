#pragma once
// The `gptoss` command line: the subcommands (tools/command.h), `gptoss help [COMMAND]`,
// `gptoss --version`, and one error convention: usage errors (unknown command or option, a value
// out of range) print "error: ..." and exit 2; a failure while running prints "error: ..." and
// exits 1.
#include <CLI/CLI.hpp>

#include <functional>
#include <map>
#include <string>

namespace gptoss::tools {

// "gptoss 0.1.0 (cuda: yes)"
std::string version_string();

// The top-level app with every registered subcommand; `runners` maps each to its run function.
void build_app(CLI::App& app, std::map<CLI::App*, std::function<int()>>& runners);

// Parses and runs; returns the exit code.
int run_cli(int argc, const char* const* argv);

}  // namespace gptoss::tools
