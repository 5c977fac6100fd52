#pragma once
// Shows weight loading on stderr (the hook of model/load_progress.h): on a terminal a bar
// redrawn in place ("\r"), otherwise a line every few seconds, and one closing line per stage.
#include <cstdint>
#include <cstdio>
#include <string>

#include "model/load_progress.h"

namespace gptoss::tools {

// A LoadProgressFn printing to `out` (a bar when `tty`). Thread-safe. `bytes_read`, when not
// null, receives the total of the "reading" stage (for the start-up summary).
LoadProgressFn make_load_progress_printer(std::FILE* out, bool tty, uint64_t* bytes_read = nullptr);
// The same on stderr, a bar when stderr is a terminal.
LoadProgressFn stderr_load_progress(uint64_t* bytes_read = nullptr);

// "1.5 GiB", "12.0 MiB", "512 B".
std::string format_bytes(double bytes);
// One progress line without its line ending, e.g.
//   "reading weights [#######.............]  35%  4.6/13.0 GiB  1.2 GiB/s  ETA 7 s"
// (the bar only when `bar`; rate and ETA once some time has passed).
std::string format_load_progress(const std::string& stage, uint64_t done, uint64_t total, double elapsed_s, bool bar);
// The closing line of a stage: "read weights: 13.0 GiB in 11.2 s (1.2 GiB/s)".
std::string format_load_done(const std::string& stage, uint64_t total, double elapsed_s);

}  // namespace gptoss::tools
