// `gptoss version` (also `gptoss --version`): what this binary was built with.
#include <cstdio>

#include "tools/cli_app.h"
#include "tools/command.h"

namespace {
gptoss::tools::RegisterCommand reg({"version", "Print the version and build options", [](CLI::App*) {
  return []() {
    std::printf("%s\n", gptoss::tools::version_string().c_str());
    return 0;
  };
}});
}  // namespace
