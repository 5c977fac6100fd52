// `gptoss version`: what this binary was built with.
#include <cstdio>

#include "tools/command.h"

namespace {
gptoss::tools::RegisterCommand reg({"version", "Print the version and build options", [](CLI::App*) {
  return []() {
    std::printf("gptoss 0.1.0 (cuda: %s)\n",
#ifdef GPTOSS_HAVE_CUDA
                "yes"
#else
                "no"
#endif
    );
    return 0;
  };
}});
}  // namespace
