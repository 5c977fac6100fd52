#pragma once
#include <string>

namespace gptoss::tools {

// The trained built-in model's compact artifact: $GPTOSS_BUILTIN_ARTIFACT when set ("random":
// none, so the random tiny model), else the repository's models/builtin/gptoss-builtin.safetensors
// when present, else "".
std::string builtin_artifact_path();

// The directory of the built-in default model, written to ${XDG_CACHE_HOME:-~/.cache}/gptoss/models
// on first use: the trained toy gpt-oss expanded from its artifact (builtin-<digest>/), or, when
// no artifact exists, random weights of preset "tiny" (tiny-v1/). Both carry the real
// o200k_harmony tokenizer.
std::string ensure_builtin_model();

}  // namespace gptoss::tools
