// The `gptoss` program: one binary, one subcommand per cmd_*.cpp file (see tools/cli_app.h).
#include "tools/cli_app.h"

int main(int argc, char** argv) { return gptoss::tools::run_cli(argc, argv); }
