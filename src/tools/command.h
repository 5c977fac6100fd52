#pragma once
// Subcommands of the `gptoss` program register themselves here (one cmd_*.cpp file each), so
// adding a command touches no shared file.
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace gptoss::tools {

struct Command {
  std::string name;
  std::string help;
  // Adds options to `sub` and returns the function that runs the command (exit code).
  std::function<std::function<int()>(CLI::App* sub)> setup;
};

std::vector<Command>& command_registry();

struct RegisterCommand {
  explicit RegisterCommand(Command c) { command_registry().push_back(std::move(c)); }
};

}  // namespace gptoss::tools
