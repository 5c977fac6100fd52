#pragma once
// The exact fp32 reference backend: the oracle for every GPU kernel and the engine of the tests.
#include <memory>

#include "backend/backend.h"
#include "model/weights.h"

namespace gptoss {

// threads: 0 = all cores.
std::unique_ptr<Backend> make_cpu_backend(std::shared_ptr<const ModelWeights> weights, int threads = 0);

}  // namespace gptoss
