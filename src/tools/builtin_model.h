#pragma once
#include <string>

namespace gptoss::tools {

// The directory of the built-in default model (random weights, preset "tiny", the real
// o200k_harmony tokenizer), written to ${XDG_CACHE_HOME:-~/.cache}/gptoss/models on first use.
std::string ensure_builtin_model();

}  // namespace gptoss::tools
