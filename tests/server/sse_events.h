#pragma once
// The data events of a server-sent-events body, as the server's streams write them: one JSON
// object per `data:` event; `data: [DONE]` sets *done. Shared by the server tests.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace ssetest {

inline std::vector<nlohmann::json> sse_events(const std::string& body, bool* done) {
  std::vector<nlohmann::json> out;
  *done = false;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t e = body.find("\n\n", pos);
    if (e == std::string::npos) break;
    std::string ev = body.substr(pos, e - pos);
    pos = e + 2;
    if (ev.rfind("data: ", 0) != 0) continue;
    if (ev == "data: [DONE]")
      *done = true;
    else
      out.push_back(nlohmann::json::parse(ev.substr(6)));
  }
  return out;
}

}  // namespace ssetest
