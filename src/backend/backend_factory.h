#pragma once
// Builds the backend a command line asks for (`--device cpu|cuda`, `--model DIR` or
// `--random-weights 120b|20b`), so tools and the server never name a concrete backend.
#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"

namespace gptoss {

struct BackendOptions {
  std::string device = "cpu";        // "cpu" | "cuda"
  std::string model_dir;             // a Hugging Face checkpoint directory, or
  std::string random_weights;        // a preset ("120b", "20b", "tiny") whose random weights the backend builds itself (cuda)
  uint64_t seed = 0;                 // for random weights
  std::string mxfp4_layers = "experts";  // "experts", or "all", or a list of qkv,o,lm_head quantized to MXFP4 at load (cuda)
  std::string mxfp4_backend = "auto";    // MXFP4 kernel family (cuda): "auto" only so far
  int threads = 0;                   // cpu: 0 = all cores
  int device_index = 0;              // cuda
};

std::unique_ptr<Backend> create_backend(const BackendOptions& opts);

}  // namespace gptoss
