#pragma once
#include <fstream>
#include <sstream>
#include <string>

#include "tokenizer/tokenizer.h"

namespace gptoss::test {

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The o200k_harmony tokenizer from the cached vocabulary (scripts/setup.sh puts it there; a
// missing vocabulary fails the tests, it does not skip them). Loaded once.
inline const Tokenizer& o200k() {
  static const Tokenizer tok = Tokenizer::o200k_harmony();
  return tok;
}

}  // namespace gptoss::test
