#pragma once
// Which model and tokenizer a command runs, the same way in every command: `--model` is a
// checkpoint directory or a Hugging Face id found in the local cache (model/hf_cache.h),
// `--random-weights` a preset built by the backend, and neither the built-in tiny model.
#include <optional>
#include <string>

#include "backend/backend_factory.h"
#include "tokenizer/tokenizer.h"

namespace gptoss::tools {

struct ModelChoice {
  std::string name;      // for banners and the API: "gpt-oss-20b", "openai/gpt-oss-20b", "gpt-oss-tiny"
  bool builtin = false;  // the built-in tiny model
};

// Resolves o.model_dir in place (a Hugging Face id becomes its snapshot directory; no model
// becomes the built-in one) and names the model. Throws gptoss::Error on a missing directory,
// an id not in the cache, or both --model and --random-weights.
ModelChoice choose_model(BackendOptions& o);

// In a process a launcher started as tensor-parallel rank > 0 (backend_factory.h: is_tp_worker):
// resolves the model as choose_model does, serves rank 0's calls and returns the exit code; the
// command then returns it without doing its own work. nullopt everywhere else.
std::optional<int> run_if_tp_worker(BackendOptions& o);

// The name a model given as `spec` is served under: a Hugging Face id as is, a directory by its
// last component ("/models/gpt-oss-20b/" -> "gpt-oss-20b").
std::string model_display_name(const std::string& spec);

// --tokenizer when given, else the model directory's tokenizer.json, else o200k_harmony (the
// gpt-oss tokenizer; what --random-weights and checkpoints without tokenizer.json use).
Tokenizer choose_tokenizer(const std::string& tokenizer_opt, const std::string& model_dir);

}  // namespace gptoss::tools
