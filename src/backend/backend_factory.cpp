#include "backend/backend_factory.h"

#include "backend/cpu/cpu_backend.h"
#include "common/error.h"
#include "model/weights.h"
#ifdef GPTOSS_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace gptoss {

Mxfp4Layers parse_mxfp4_layers(const std::string& spec) {
  Mxfp4Layers r;
  if (spec.empty() || spec == "experts") return r;
  if (spec == "all") {
    r.qkv = r.o = r.lm_head = true;
    return r;
  }
  size_t at = 0;
  while (at <= spec.size()) {
    size_t end = spec.find(',', at);
    if (end == std::string::npos) end = spec.size();
    std::string name = spec.substr(at, end - at);
    if (name == "qkv")
      r.qkv = true;
    else if (name == "o")
      r.o = true;
    else if (name == "lm_head")
      r.lm_head = true;
    else if (name != "experts")
      throw Error("--mxfp4-layers: unknown layer \"" + name + "\" (expected experts, all, or a comma list of qkv, o, lm_head)");
    at = end + 1;
  }
  return r;
}

std::unique_ptr<Backend> create_backend(const BackendOptions& o) {
  parse_mxfp4_layers(o.mxfp4_layers);  // a bad list is an error on every device
  if (o.device == "cpu") {
    if (!o.random_weights.empty())
      throw Error("--random-weights builds weights on the GPU; on the CPU, write a model with "
                  "`gptoss make-model --preset " + o.random_weights + "` and pass --model");
    if (o.model_dir.empty()) throw Error("no model: pass --model DIR");
    if (parse_mxfp4_layers(o.mxfp4_layers).any())
      throw Error("--mxfp4-layers is a CUDA option (the CPU backend is the exact reference)");
    if (o.dense_dtype != "bf16")
      throw Error("--dense-dtype " + o.dense_dtype + " is a CUDA option (the CPU backend is the exact reference)");
    return make_cpu_backend(ModelWeights::load(o.model_dir, o.load_progress), o.threads);
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
