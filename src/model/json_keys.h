#pragma once
// Reading the keys of a config.json, with errors that name the file and the key; shared by the
// gpt-oss config (config.cpp) and the Eagle3 head config (eagle3_weights.cpp).
#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "common/error.h"

namespace gptoss::json_keys {

// `v` as a T: integers only from JSON integers in T's range (nlohmann's get<int> would take 2.9
// as 2, true as 1 and 2^32 + 64 as 64), numbers only from JSON numbers.
template <class T>
T convert(const nlohmann::json& v, const char* key, const std::string& where) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (!v.is_number_integer()) throw Error(where + ": key \"" + key + "\" must be an integer");
    const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max())
                                             : v.get<int64_t>() >= int64_t(std::numeric_limits<T>::min()) &&
                                                   v.get<int64_t>() <= int64_t(std::numeric_limits<T>::max());
    if (!fits) throw Error(where + ": key \"" + key + "\" is out of range (" + v.dump() + ")");
    return v.get<T>();
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) throw Error(where + ": key \"" + key + "\" must be a number");
    return v.get<T>();
  } else {
    try {
      return v.get<T>();
    } catch (const nlohmann::json::exception&) {
      throw Error(where + ": key \"" + key + "\" has the wrong type");
    }
  }
}

// The value of `key`; a missing or null key is an error.
template <class T>
T need(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || j.at(key).is_null()) throw Error(where + ": missing key \"" + key + "\"");
  return convert<T>(j.at(key), key, where);
}

// The value of `key`, or `dflt` when it is missing or null.
template <class T>
T want(const nlohmann::json& j, const char* key, T dflt, const std::string& where) {
  if (!j.contains(key) || j.at(key).is_null()) return dflt;
  return convert<T>(j.at(key), key, where);
}

}  // namespace gptoss::json_keys
