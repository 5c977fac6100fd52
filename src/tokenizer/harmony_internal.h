#pragma once
// What harmony.cpp (the renderer) and harmony_parser.cpp (the streaming parser) share: the
// formatting tokens' names and a string join.
#include <string>
#include <vector>

namespace gptoss::harmony::internal {

inline constexpr const char* kStart = "<|start|>";
inline constexpr const char* kMessage = "<|message|>";
inline constexpr const char* kEnd = "<|end|>";
inline constexpr const char* kReturn = "<|return|>";
inline constexpr const char* kCall = "<|call|>";
inline constexpr const char* kChannel = "<|channel|>";
inline constexpr const char* kConstrain = "<|constrain|>";

inline std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += sep;
    out += v[i];
  }
  return out;
}

}  // namespace gptoss::harmony::internal
