#pragma once
// One exception type for every user-facing failure: the message names the file, tensor or
// field at fault, so the CLI and the server can print it as is.
#include <stdexcept>
#include <string>

namespace gptoss {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

}  // namespace gptoss
