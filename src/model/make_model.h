#pragma once
// Random-weight gpt-oss checkpoints in the exact published layout (config.json, sharded
// safetensors with MXFP4 experts, index json), so tests and benchmarks need no download.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/config.h"

namespace gptoss {

// A "loop" random model, for speculative-decoding benchmarks at real shapes: random weights
// whose greedy continuation of token first_id + i is first_id + (i + 1) % tokens, so a prompt of
// that cycle is text the n-gram drafter predicts. The embedding row of cycle token i is
// embed_scale on dimension i and zero elsewhere, which dwarfs what the random layers add to the
// residual stream (they see it through RMSNorm, so their outputs do not grow with it), and the
// lm_head row of its successor is head_scale on dimension i: after the final norm its logit is
// ~head_scale * sqrt(hidden) against random logits of ~0.02 * sqrt(hidden). Every other weight
// is as random as ever, so the kernels' work (routing included: each cycle token routes by its
// own direction) is that of any random model.
struct LoopSpec {
  int tokens = 0;  // cycle length; 0: an ordinary random model
  int first_id = 1000;
  // The random layers' outputs add up over depth (~1e3 in norm at 120b's 36 layers, by a rough
  // estimate); 4096 keeps the cycle's direction dominant there too.
  float embed_scale = 4096.f;
  float head_scale = 1.f;
  bool active() const { return tokens > 0; }
  // Throws unless 1 <= tokens <= hidden and the cycle's ids are in the vocabulary.
  void check(const GptOssConfig& c) const;
  // Calls set_row(row, values) for each row of the embedding (lm_head = false) or lm_head that
  // the loop replaces: values are `hidden` bf16 bit patterns.
  void rows(int hidden, bool lm_head, const std::function<void(int64_t, const std::vector<uint16_t>&)>& set_row) const;
};

// Writes config.json, model-XXXXX-of-YYYYY.safetensors shards of about `shard_bytes` each and
// model.safetensors.index.json into `out_dir` (created if absent). Deterministic in `seed`: the
// same seed gives byte-identical files, whatever the number of threads.
// loop: a loop model (LoopSpec) instead of an ordinary one.
void make_random_model(const GptOssConfig& c, const std::string& out_dir, uint64_t seed,
                       size_t shard_bytes = size_t(4) << 30, const LoopSpec& loop = {});

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
