#pragma once
// JSON lines as the stdin filters read them (tokenize, harmony-parse: the interface of
// tests/tools/o200k-oracle): one JSON value a line, blank lines skipped.
#include <nlohmann/json.hpp>

#include <istream>
#include <string>

#include "common/error.h"

namespace gptoss::tools {

// Calls fn(value, where) for each non-blank line of `in`, where = "WHO: line N" (1-based) for the
// caller's error messages; a line that is not JSON throws gptoss::Error "WHO: line N: invalid JSON: ...".
template <class Fn>
void for_each_json_line(std::istream& in, const std::string& who, Fn&& fn) {
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = who + ": line " + std::to_string(line_no);
    nlohmann::json v;
    try {
      v = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw Error(where + ": invalid JSON: " + e.what());
    }
    fn(v, where);
  }
}

}  // namespace gptoss::tools
