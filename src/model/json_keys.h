#pragma once
// Reading the keys of a config.json, with errors that name the file and the key; shared by the
// gpt-oss config (config.cpp) and the Eagle3 head config (eagle3_weights.cpp).
#include <nlohmann/json.hpp>

#include <string>

#include "common/error.h"

namespace gptoss::json_keys {

// The value of `key`; a missing or null key is an error.
template <class T>
T need(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || j.at(key).is_null()) throw Error(where + ": missing key \"" + key + "\"");
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw Error(where + ": key \"" + key + "\" has the wrong type");
  }
}

// The value of `key`, or `dflt` when it is missing or null.
template <class T>
T want(const nlohmann::json& j, const char* key, T dflt, const std::string& where) {
  if (!j.contains(key) || j.at(key).is_null()) return dflt;
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw Error(where + ": key \"" + key + "\" has the wrong type");
  }
}

}  // namespace gptoss::json_keys
