#include "backend/backend_factory.h"

#include "backend/cpu/cpu_backend.h"
#include "common/error.h"
#include "model/weights.h"
#ifdef GPTOSS_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace gptoss {

std::unique_ptr<Backend> create_backend(const BackendOptions& o) {
  if (o.device == "cpu") {
    if (!o.random_weights.empty())
      throw Error("--random-weights builds weights on the GPU; on the CPU, write a model with "
                  "`gptoss make-model --preset " + o.random_weights + "` and pass --model");
    if (o.model_dir.empty()) throw Error("no model: pass --model DIR");
    if (o.mxfp4_layers != "experts" && !o.mxfp4_layers.empty())
      throw Error("--mxfp4-layers is a CUDA option (the CPU backend is the exact reference)");
    return make_cpu_backend(ModelWeights::load(o.model_dir), o.threads);
  }
  if (o.device == "cuda") {
#ifdef GPTOSS_HAVE_CUDA
    return make_cuda_backend(o);
#else
    throw Error("this gptoss was built without CUDA (configure with nvcc available)");
#endif
  }
  throw Error("unknown device \"" + o.device + "\" (expected cpu or cuda)");
}

}  // namespace gptoss
