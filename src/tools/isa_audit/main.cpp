// gptoss-isa-audit: the auditor as a standalone program (same as `gptoss isa-audit`), small and
// statically linked against libstdc++ so it can be carried to a GPU machine.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "tools/isa_audit/isa_audit.h"

int main(int argc, char** argv) {
  CLI::App app{"gptoss-isa-audit: PTX/SASS ISA auditor (phase1, phase2, run, phase3, list)"};
  auto run = gptoss::isa::setup_cli(&app, {});
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
