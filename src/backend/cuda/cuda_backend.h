#pragma once
// The CUDA backend: gpt-oss on one NVIDIA GPU (sm_90a tuned; sm_100a/120a/121a portable path).
#include <memory>

#include "backend/backend.h"
#include "backend/backend_factory.h"

namespace gptoss {

// Loads `opts.model_dir` (weights uploaded once, MXFP4 experts kept packed) or builds
// `opts.random_weights` ("120b", "20b", "tiny") directly in GPU memory from `opts.seed`.
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opts);

}  // namespace gptoss
