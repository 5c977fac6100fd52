#pragma once
#include <string>
#include <vector>

#include "common/error.h"

namespace gptoss::tools {

// "1,2,3" -> {1,2,3}; throws gptoss::Error on anything else.
inline std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string tok = s.substr(i, j - i);
    try {
      size_t used = 0;
      long v = std::stol(tok, &used);
      if (used != tok.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument("");
      ids.push_back(int32_t(v));
    } catch (const std::exception&) {
      throw Error("bad token id \"" + tok + "\" in \"" + s + "\" (expected comma-separated integers)");
    }
    i = j + 1;
  }
  if (ids.empty()) throw Error("empty list of token ids");
  return ids;
}

}  // namespace gptoss::tools
