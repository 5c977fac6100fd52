#include "tools/load_progress.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <mutex>

namespace gptoss::tools {

namespace {
using Clock = std::chrono::steady_clock;

// "reading" -> "reading weights", "quantizing" -> "quantizing weights".
std::string what(const std::string& stage) { return stage + " weights"; }

std::string done_verb(const std::string& stage) {
  if (stage == "reading") return "read weights";
  return stage + " weights done";
}
}  // namespace

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

std::string format_load_progress(const std::string& stage, uint64_t done, uint64_t total, double elapsed_s, bool bar) {
  std::string s = what(stage);
  double frac = total > 0 ? std::min(1.0, double(done) / double(total)) : 0.0;
  if (bar) {
    const int width = 30;
    int full = int(frac * width);
    s += " [" + std::string(full, '#') + std::string(width - full, '.') + "]";
  }
  char buf[160];
  std::snprintf(buf, sizeof buf, " %3d%%  %s/%s", int(frac * 100), format_bytes(double(done)).c_str(),
                format_bytes(double(total)).c_str());
  s += buf;
  if (elapsed_s > 0.05 && done > 0) {
    double rate = double(done) / elapsed_s;
    s += "  " + format_bytes(rate) + "/s";
    if (done < total) {
      std::snprintf(buf, sizeof buf, "  ETA %.0f s", std::ceil(double(total - done) / rate));
      s += buf;
    }
  }
  return s;
}

std::string format_load_done(const std::string& stage, uint64_t total, double elapsed_s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s: %s in %.1f s", done_verb(stage).c_str(), format_bytes(double(total)).c_str(),
                elapsed_s);
  std::string s = buf;
  if (elapsed_s > 0.05) s += " (" + format_bytes(double(total) / elapsed_s) + "/s)";
  return s;
}

LoadProgressFn make_load_progress_printer(std::FILE* out, bool tty, uint64_t* bytes_read) {
  struct State {
    std::mutex mu;
    std::string stage;
    Clock::time_point start, last_print;
    bool finished = false;
    bool drawn = false;  // a bar is on the terminal's current line
  };
  auto st = std::make_shared<State>();
  return [st, out, tty, bytes_read](const std::string& stage, uint64_t done, uint64_t total) {
    std::lock_guard<std::mutex> l(st->mu);
    auto now = Clock::now();
    if (stage != st->stage || (done == 0 && st->finished)) {  // a new stage
      st->stage = stage;
      st->start = st->last_print = now;
      st->finished = false;
    }
    if (st->finished || total == 0) return;
    double elapsed = std::chrono::duration<double>(now - st->start).count();
    if (done >= total) {
      st->finished = true;
      if (stage == "reading" && bytes_read) *bytes_read = total;
      std::fprintf(out, "%s%s\n", st->drawn ? "\r\033[K" : "", format_load_done(stage, total, elapsed).c_str());
      st->drawn = false;
      std::fflush(out);
      return;
    }
    // A terminal: redraw ten times a second. A log: a line every 5 s.
    double since = std::chrono::duration<double>(now - st->last_print).count();
    if (tty ? since < 0.1 && st->drawn : since < 5.0) return;
    st->last_print = now;
    if (tty) {
      std::fprintf(out, "\r\033[K%s", format_load_progress(stage, done, total, elapsed, true).c_str());
      st->drawn = true;
    } else {
      std::fprintf(out, "%s\n", format_load_progress(stage, done, total, elapsed, false).c_str());
    }
    std::fflush(out);
  };
}

LoadProgressFn stderr_load_progress(uint64_t* bytes_read) {
  return make_load_progress_printer(stderr, isatty(fileno(stderr)) != 0, bytes_read);
}

}  // namespace gptoss::tools
