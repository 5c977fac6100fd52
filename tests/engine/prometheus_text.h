#pragma once
// The samples of a Prometheus text rendering (engine/metrics, the server's /metrics):
// "name{labels}" -> value; comments and blank lines skipped. Shared by the engine and server tests.
#include <map>
#include <sstream>
#include <string>

namespace promtest {

inline std::map<std::string, double> parse_samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    size_t sp = line.rfind(' ');
    out[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  return out;
}

}  // namespace promtest
