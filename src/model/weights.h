#pragma once
// The gpt-oss tensors of a checkpoint, by role, each checked against the config (name, dtype,
// shape). Views point into the memory-mapped files; backends repack them at load.
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/load_progress.h"
#include "model/safetensors.h"

namespace gptoss {

struct LayerWeights {
  const TensorView* attn_norm;                 // [H] bf16
  const TensorView *q_w, *q_b, *k_w, *k_b, *v_w, *v_b;  // [out, H] bf16, [out] bf16
  const TensorView *o_w, *o_b;                 // [H, q_dim], [H]
  const TensorView* sinks;                     // [num_heads] bf16 or f32
  const TensorView* mlp_norm;                  // [H]
  const TensorView *router_w, *router_b;       // [E, H], [E]
  const TensorView *gate_up_blocks, *gate_up_scales, *gate_up_bias;  // [E, 2I, H/32, 16] u8, [E, 2I, H/32] u8, [E, 2I]
  const TensorView *down_blocks, *down_scales, *down_bias;           // [E, H, I/32, 16], [E, H, I/32], [E, H]
};

struct ModelWeights {
  GptOssConfig config;
  std::shared_ptr<Checkpoint> checkpoint;  // keeps the mappings alive
  const TensorView* embed;       // [V, H] bf16
  const TensorView* final_norm;  // [H]
  const TensorView* lm_head;     // [V, H]
  std::vector<LayerWeights> layers;

  // Reads config.json and the safetensors of `dir`; throws gptoss::Error naming the file and
  // tensor on anything missing, truncated or mis-shaped. With a `progress` hook it also reads
  // every byte of the files once, reporting as it goes (stage "reading"); without one the
  // weights are faulted in from the mapping when first used.
  static std::shared_ptr<const ModelWeights> load(const std::string& dir, const LoadProgressFn& progress = {});
};

// Reads one element of a small float vector stored as bf16, f16 or f32.
float tensor_float_at(const TensorView& t, int64_t i);

}  // namespace gptoss
