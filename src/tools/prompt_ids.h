#pragma once
// Token ids as the commands read them: a comma list (--prompt-ids) or a JSON array a line
// (tokenize --decode, harmony-parse).
#include <nlohmann/json.hpp>

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

// A JSON line's ids: an array of integers from 0 to 2^31-1 (not 1.5, "a" or a value that would
// wrap); errors start with `where` ("tokenize: line 3").
inline std::vector<int32_t> ids_of_json_array(const nlohmann::json& v, const std::string& where) {
  if (!v.is_array()) throw Error(where + ": expected a JSON array of ids");
  std::vector<int32_t> ids;
  for (const auto& x : v) {
    const bool ok = x.is_number_unsigned()  ? x.get<uint64_t>() <= uint64_t(INT32_MAX)
                    : x.is_number_integer() ? x.get<int64_t>() >= 0 && x.get<int64_t>() <= INT32_MAX
                                            : false;
    if (!ok) throw Error(where + ": token id " + x.dump() + " is not an integer from 0 to 2147483647");
    ids.push_back(int32_t(x.get<int64_t>()));
  }
  return ids;
}

}  // namespace gptoss::tools
