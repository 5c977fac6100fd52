#pragma once
// An Eagle3 draft head in the published Hugging Face layout (the `*-Eagle3` checkpoints that
// SpecForge / TensorRT Model Optimizer train for gpt-oss; see docs/EAGLE3.md for the format and
// its sources): config.json (architectures LlamaForCausalLMEagle3) and safetensors with
//   fc.weight                          [H, 3*Ht]  the three tapped target hidden states -> H
//   midlayer.input_layernorm.weight    [H]        norm of the token embedding
//   midlayer.hidden_norm.weight        [H]        norm of the fc output / previous draft state
//   midlayer.self_attn.{q,k,v}_proj.weight [heads*hd | kv*hd, 2*H]  over [embed ; hidden]
//   midlayer.self_attn.o_proj.weight   [H, heads*hd]
//   midlayer.post_attention_layernorm.weight [H]
//   midlayer.mlp.{gate,up}_proj.weight [I, H], midlayer.mlp.down_proj.weight [H, I]
//   norm.weight [H], lm_head.weight [draft_vocab, H]
//   d2t [draft_vocab] int64 (target id = draft id + d2t[id]), t2d [vocab] bool (unused here)
//   embed_tokens.weight [vocab, H]     optional: absent, the target's embedding is shared
// ("layers.0." is accepted for "midlayer.", as vLLM's loader does.)
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/safetensors.h"

namespace gptoss {

struct Eagle3Config {
  int hidden = 2880;
  int num_heads = 64;
  int num_kv_heads = 8;
  int head_dim = 64;
  int intermediate = 17280;
  int vocab = 201088;         // the target's vocabulary (embedding rows, t2d)
  int draft_vocab = 32000;    // lm_head rows
  int target_hidden = 2880;   // fc takes 3 x this
  float rms_eps = 1e-5f;
  double rope_theta = 10000.0;      // Llama's default when config.json has none (SpecForge's gpt-oss heads)
  bool rope_yarn = false;           // rope_scaling {"rope_type":"yarn", ...}: the fields below
  RopeConfig yarn;
  bool norm_before_residual = false;  // vLLM's flag: the residual starts after hidden_norm
  // eagle_config.eagle_aux_hidden_state_layer_ids: target layers whose OUTPUTS feed fc, in
  // order. Empty: the default SGLang and vLLM use, outputs of layers 1, L/2-1, L-4.
  std::vector<int> aux_layers;

  std::vector<int> tap_layers(int target_layers) const;  // resolved; throws when out of range
  static Eagle3Config from_json(const nlohmann::json& j, const std::string& where);
  static Eagle3Config from_file(const std::string& path);
  // "eagle3-120b", "eagle3-20b", "eagle3-tiny" (matches the built-in tiny target). Throws otherwise.
  static Eagle3Config preset(const std::string& name);
  nlohmann::json to_json() const;
};

struct Eagle3Weights {
  Eagle3Config config;
  std::shared_ptr<Checkpoint> checkpoint;  // keeps the mappings alive
  const TensorView* embed = nullptr;       // [vocab, H] bf16, or null (share the target's)
  const TensorView *fc, *input_norm, *hidden_norm, *q, *k, *v, *o, *post_norm, *gate, *up, *down, *norm, *lm_head;
  std::vector<int32_t> draft_to_target;    // [draft_vocab] target ids (d2t applied; identity when absent)

  // Reads config.json and the safetensors of `dir`; throws gptoss::Error naming the file and
  // tensor on anything missing, mis-typed or mis-shaped, and on d2t entries outside the vocabulary.
  static std::shared_ptr<const Eagle3Weights> load(const std::string& dir);
};

// A random head in that layout (config.json + model.safetensors, embed_tokens included when
// `with_embed`), deterministic in `seed`. d2t maps draft id i to target id i * stride with
// stride = vocab / draft_vocab, so the draft vocabulary spreads over the target's.
void make_random_eagle3(const Eagle3Config& c, const std::string& out_dir, uint64_t seed, bool with_embed = true);

}  // namespace gptoss
