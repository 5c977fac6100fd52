#pragma once
// Random-weight gpt-oss checkpoints in the exact published layout (config.json, sharded
// safetensors with MXFP4 experts, index json), so tests and benchmarks need no download.
#include <cstdint>
#include <string>

#include "model/config.h"

namespace gptoss {

// Writes config.json, model-XXXXX-of-YYYYY.safetensors shards of about `shard_bytes` each and
// model.safetensors.index.json into `out_dir` (created if absent). Deterministic in `seed`: the
// same seed gives byte-identical files, whatever the number of threads.
void make_random_model(const GptOssConfig& c, const std::string& out_dir, uint64_t seed,
                       size_t shard_bytes = size_t(4) << 30);

// The random value generator make_random_model uses, exposed so backends that build random
// weights in memory (the CUDA `--random-weights`) can describe the same distributions.
struct RandomWeightSpec {
  float embed_std = 1.0f;   // embedding rows (RMSNorm follows, so the scale is free)
  float dense_std = 0.02f;  // q/k/v/o, router, lm_head
  float bias_std = 0.02f;
  float norm_std = 0.1f;    // norm weights are 1 + N(0, norm_std)
  int scale_lo = 118, scale_hi = 121;  // e8m0 scales of MXFP4 blocks, uniform in [lo, hi]
};

}  // namespace gptoss
