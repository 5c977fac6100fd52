#pragma once
// An independent validator of the JSON Schema subset structured output supports: the oracle
// the matcher's documents and the server's constrained answers are checked against.
#include <algorithm>
#include <cmath>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

namespace gptoss::testing {
namespace schema_oracle {
using json = nlohmann::json;
inline bool valid(const json& s, const json& v, const json& root);

inline bool type_ok(const std::string& t, const json& v) {
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  if (t == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  return false;
}

inline bool valid(const json& s, const json& v, const json& root) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("$ref")) {
    std::string r = s["$ref"];
    if (r == "#") return valid(root, v, root);
    std::string name = r.substr(r.rfind('/') + 1);
    return valid(root.contains("$defs") ? root["$defs"][name] : root["definitions"][name], v, root);
  }
  if (s.contains("const") && s["const"] != v) return false;
  if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end()) return false;
  for (const char* k : {"anyOf", "oneOf"})
    if (s.contains(k)) {
      int n = 0;
      for (const auto& a : s[k]) n += valid(a, v, root);
      if (n == 0 || (std::string(k) == "oneOf" && n != 1)) return false;
    }
  if (s.contains("type")) {
    bool ok = false;
    if (s["type"].is_string()) ok = type_ok(s["type"], v);
    else
      for (const auto& t : s["type"]) ok |= type_ok(t, v);
    if (!ok) return false;
  }
  if (v.is_object()) {
    const json props = s.value("properties", json::object());
    for (const auto& r : s.value("required", json::array()))
      if (!v.contains(r.get<std::string>())) return false;
    for (const auto& [k, x] : v.items()) {
      if (props.contains(k)) {
        if (!valid(props[k], x, root)) return false;
      } else if (s.contains("additionalProperties")) {
        if (!valid(s["additionalProperties"], x, root)) return false;
      }
    }
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
    if (s.contains("items"))
      for (const auto& x : v)
        if (!valid(s["items"], x, root)) return false;
  }
  if (v.is_string() && (s.contains("minLength") || s.contains("maxLength"))) {
    size_t chars = 0;  // code points: UTF-8 bytes that start a character
    for (unsigned char c : v.get_ref<const std::string&>()) chars += (c & 0xC0) != 0x80;
    if (s.contains("minLength") && chars < s["minLength"].get<size_t>()) return false;
    if (s.contains("maxLength") && chars > s["maxLength"].get<size_t>()) return false;
  }
  if (v.is_string() && s.contains("format")) {
    static const std::regex date(R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01]))");
    static const std::regex time(R"(([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,9})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))");
    static const std::regex uuid(R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})");
    std::string f = s["format"], x = v.get<std::string>();
    if (f == "date" && !std::regex_match(x, date)) return false;
    if (f == "time" && !std::regex_match(x, time)) return false;
    if (f == "uuid" && !std::regex_match(x, uuid)) return false;
    if (f == "date-time") {
      size_t t = x.find('T');
      if (t == std::string::npos || !std::regex_match(x.substr(0, t), date) || !std::regex_match(x.substr(t + 1), time))
        return false;
    }
  }
  return true;
}

}  // namespace schema_oracle

inline bool schema_valid(const nlohmann::json& schema, const nlohmann::json& v) {
  return schema_oracle::valid(schema, v, schema);
}

}  // namespace gptoss::testing
