#pragma once
// The gpt-oss hyper-parameters, read from a Hugging Face config.json (every key the published
// checkpoints use) or built from a preset for random-weight models.
#include <nlohmann/json_fwd.hpp>

#include <string>
#include <vector>

namespace gptoss {

struct RopeConfig {
  double theta = 150000.0;
  double factor = 32.0;
  double original_max_position = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = false;
};

struct GptOssConfig {
  int hidden = 2880;
  int num_layers = 36;
  int num_heads = 64;
  int num_kv_heads = 8;
  int head_dim = 64;
  int num_experts = 128;
  int experts_per_token = 4;
  int intermediate = 2880;
  int vocab = 201088;
  int sliding_window = 128;
  std::vector<bool> layer_sliding;  // per layer: true = sliding_attention, false = full_attention
  RopeConfig rope;
  int max_position_embeddings = 131072;
  float swiglu_limit = 7.0f;
  float rms_eps = 1e-5f;
  int eos_token_id = 200002;
  int pad_token_id = 199999;

  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
  int num_sliding_layers() const;
  int num_full_layers() const { return num_layers - num_sliding_layers(); }

  // Throws gptoss::Error naming the key on a missing or inconsistent field.
  static GptOssConfig from_json(const nlohmann::json& j, const std::string& where);
  static GptOssConfig from_file(const std::string& path);
  // "tiny" (the built-in default), "20b", "120b". Throws on an unknown name.
  static GptOssConfig preset(const std::string& name);
  nlohmann::json to_json() const;  // the Hugging Face config.json layout
};

// A JSON file parsed, or gptoss::Error naming the path ("cannot open" + `missing_hint`, or the
// parser's message). Used by every config.json reader of model/.
nlohmann::json read_json_file(const std::string& path, const std::string& missing_hint = "");

// YaRN inverse frequencies (head_dim/2 of them) and the cos/sin scale, computed in float32 the
// way transformers' _compute_yarn_parameters does, so positions rotate bit-for-bit alike.
struct YarnTables {
  std::vector<float> inv_freq;
  float attention_scaling = 1.0f;
};
YarnTables compute_yarn(const GptOssConfig& c);

}  // namespace gptoss
