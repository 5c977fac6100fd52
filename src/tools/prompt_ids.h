#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/error.h"

namespace gptoss::tools {

// "1,2,3" -> {1,2,3}; throws gptoss::Error on anything else (an empty item too: "1,,2", "1,2,").
inline std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  if (s.empty()) throw Error("empty list of token ids");
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string tok = s.substr(i, j - i);
    try {
      size_t used = 0;
      if (tok.empty()) throw std::invalid_argument("");
      long long v = std::stoll(tok, &used);
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
