#include "model/config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/files.h"
#include "model/json_keys.h"

namespace gptoss {

using nlohmann::json;

int GptOssConfig::num_sliding_layers() const {
  int n = 0;
  for (bool s : layer_sliding) n += s;
  return n;
}

using json_keys::need;
using json_keys::want;

namespace {
void positive(int v, const char* key, const std::string& where) {
  if (v <= 0) throw Error(where + ": \"" + key + "\" must be positive");
}
// Sizes far past any gpt-oss model are refused, so that no product of them (q_dim, the expert
// matrices, a layer's KV row) overflows the int the code keeps it in: 16 heads of 2^30 + 16 once
// wrapped to 256 and passed every shape check, then wrote past a buffer.
void at_most(int64_t v, int64_t hi, const char* what, const std::string& where) {
  if (v > hi) throw Error(where + ": " + what + " is " + std::to_string(v) + ", more than this engine takes (" + std::to_string(hi) + ")");
}
void finite_positive(double v, const char* key, const std::string& where) {
  if (!std::isfinite(v) || v <= 0) throw Error(where + ": \"" + key + "\" must be a positive finite number");
}
}  // namespace

GptOssConfig GptOssConfig::from_json(const json& j, const std::string& where) {
  if (!j.is_object()) throw Error(where + ": not a JSON object");
  GptOssConfig c;
  auto mt = want<std::string>(j, "model_type", "gpt_oss", where);
  if (mt != "gpt_oss") throw Error(where + ": model_type is \"" + mt + "\", expected \"gpt_oss\"");
  c.hidden = need<int>(j, "hidden_size", where);
  c.num_layers = need<int>(j, "num_hidden_layers", where);
  c.num_heads = need<int>(j, "num_attention_heads", where);
  c.num_kv_heads = need<int>(j, "num_key_value_heads", where);
  c.head_dim = want<int>(j, "head_dim", c.num_heads ? c.hidden / c.num_heads : 0, where);
  c.num_experts = need<int>(j, "num_local_experts", where);
  if (j.contains("num_experts_per_tok")) c.experts_per_token = need<int>(j, "num_experts_per_tok", where);
  else c.experts_per_token = need<int>(j, "experts_per_token", where);
  if (j.contains("num_experts_per_tok") && j.contains("experts_per_token") && !j["experts_per_token"].is_null() &&
      need<int>(j, "experts_per_token", where) != c.experts_per_token)
    throw Error(where + ": \"experts_per_token\" and \"num_experts_per_tok\" disagree");
  c.intermediate = need<int>(j, "intermediate_size", where);
  c.vocab = need<int>(j, "vocab_size", where);
  c.sliding_window = want<int>(j, "sliding_window", 128, where);
  c.max_position_embeddings = want<int>(j, "max_position_embeddings", 131072, where);
  c.swiglu_limit = want<float>(j, "swiglu_limit", 7.0f, where);
  c.rms_eps = want<float>(j, "rms_norm_eps", 1e-5f, where);
  c.eos_token_id = want<int>(j, "eos_token_id", -1, where);
  c.pad_token_id = want<int>(j, "pad_token_id", -1, where);
  for (auto [v, k] : {std::pair{c.hidden, "hidden_size"}, {c.num_layers, "num_hidden_layers"},
                      {c.num_heads, "num_attention_heads"}, {c.num_kv_heads, "num_key_value_heads"},
                      {c.head_dim, "head_dim"}, {c.num_experts, "num_local_experts"},
                      {c.experts_per_token, "num_experts_per_tok"}, {c.intermediate, "intermediate_size"},
                      {c.vocab, "vocab_size"}, {c.sliding_window, "sliding_window"}})
    positive(v, k, where);
  if (c.max_position_embeddings < 2) throw Error(where + ": \"max_position_embeddings\" must be at least 2");
  at_most(c.hidden, 1 << 16, "hidden_size", where);
  at_most(c.num_layers, 1 << 12, "num_hidden_layers", where);
  at_most(c.num_heads, 1 << 12, "num_attention_heads", where);
  at_most(c.head_dim, 1 << 12, "head_dim", where);
  at_most(int64_t(c.num_heads) * c.head_dim, 1 << 18, "num_attention_heads x head_dim", where);
  at_most(c.num_experts, 1 << 16, "num_local_experts", where);
  at_most(c.intermediate, 1 << 18, "intermediate_size", where);
  at_most(c.vocab, 1 << 24, "vocab_size", where);
  finite_positive(c.rms_eps, "rms_norm_eps", where);
  if (c.rms_eps >= 1) throw Error(where + ": \"rms_norm_eps\" must be below 1");
  finite_positive(c.swiglu_limit, "swiglu_limit", where);
  // (A token id, or -1 for none; not bounded by vocab_size: a model whose rows are a subset of
  // o200k, as the built-in one, keeps o200k's ids for its specials.)
  for (auto [v, k] : {std::pair{c.eos_token_id, "eos_token_id"}, {c.pad_token_id, "pad_token_id"}})
    if (v < -1 || v >= (1 << 24))
      throw Error(where + ": \"" + std::string(k) + "\" is " + std::to_string(v) + ", not a token id (-1 for none)");
  if (c.num_heads % c.num_kv_heads) throw Error(where + ": num_attention_heads must be a multiple of num_key_value_heads");
  if (c.experts_per_token > c.num_experts) throw Error(where + ": num_experts_per_tok exceeds num_local_experts");
  if (c.hidden % 32 || c.intermediate % 32) throw Error(where + ": hidden_size and intermediate_size must be multiples of 32 (MXFP4 blocks)");
  if (c.head_dim % 2) throw Error(where + ": head_dim must be even");

  if (j.contains("layer_types")) {
    auto lt = need<std::vector<std::string>>(j, "layer_types", where);
    if (int(lt.size()) != c.num_layers)
      throw Error(where + ": layer_types has " + std::to_string(lt.size()) + " entries, num_hidden_layers is " + std::to_string(c.num_layers));
    for (auto& t : lt) {
      if (t == "sliding_attention") c.layer_sliding.push_back(true);
      else if (t == "full_attention") c.layer_sliding.push_back(false);
      else throw Error(where + ": unknown layer type \"" + t + "\"");
    }
  } else {
    for (int i = 0; i < c.num_layers; ++i) c.layer_sliding.push_back(i % 2 == 0);
  }

  c.rope.theta = want<double>(j, "rope_theta", 150000.0, where);
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    const json& r = j["rope_scaling"];
    std::string w = where + ": rope_scaling";
    auto type = want<std::string>(r, "rope_type", want<std::string>(r, "type", "yarn", w), w);
    if (type != "yarn") throw Error(w + ": rope_type \"" + type + "\" is not supported (gpt-oss uses yarn)");
    c.rope.factor = need<double>(r, "factor", w);
    c.rope.original_max_position = want<double>(r, "original_max_position_embeddings", c.max_position_embeddings, w);
    c.rope.beta_fast = want<double>(r, "beta_fast", 32.0, w);
    c.rope.beta_slow = want<double>(r, "beta_slow", 1.0, w);
    c.rope.truncate = want<bool>(r, "truncate", true, w);
    // transformers derives the factor from the context lengths when both are given.
    if (r.contains("original_max_position_embeddings"))
      c.rope.factor = double(c.max_position_embeddings) / c.rope.original_max_position;
  } else {
    c.rope.factor = 1.0;
  }
  // A zero or negative theta, factor or original context made every logit NaN (the rotation
  // tables), and a model that answers token 0 forever.
  finite_positive(c.rope.theta, "rope_theta", where);
  finite_positive(c.rope.original_max_position, "rope_scaling.original_max_position_embeddings", where);
  finite_positive(c.rope.factor, "rope_scaling.factor", where);
  if (!std::isfinite(c.rope.beta_fast) || !std::isfinite(c.rope.beta_slow))
    throw Error(where + ": rope_scaling.beta_fast and beta_slow must be finite");
  if (j.contains("quantization_config") && !j["quantization_config"].is_null()) {
    auto qm = want<std::string>(j["quantization_config"], "quant_method", "", where + ": quantization_config");
    if (qm != "mxfp4") throw Error(where + ": quantization_config.quant_method \"" + qm + "\" is not supported (expected mxfp4)");
  }
  return c;
}

nlohmann::json read_json_file(const std::string& path, const std::string& missing_hint) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw Error(path + ": cannot open" + missing_hint);
  const std::string text = read_regular_file(path);  // (a directory or a FIFO: an error naming it)
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error(path + ": invalid JSON: " + e.what());
  }
}

GptOssConfig GptOssConfig::from_file(const std::string& path) { return from_json(read_json_file(path), path); }

GptOssConfig GptOssConfig::preset(const std::string& name) {
  GptOssConfig c;  // defaults are gpt-oss-120b
  if (name == "120b") {
  } else if (name == "20b") {
    c.num_layers = 24;
    c.num_experts = 32;
  } else if (name == "tiny") {
    // Small enough to serve on any CPU, with the real vocabulary and every structural feature
    // (GQA, both layer types, top-k < experts, window crossed by short prompts).
    c.hidden = 128;
    c.num_layers = 2;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 32;
    c.num_experts = 8;
    c.experts_per_token = 2;
    c.intermediate = 128;
    c.sliding_window = 16;
  } else {
    throw Error("unknown preset \"" + name + "\" (expected tiny, 20b or 120b)");
  }
  c.layer_sliding.clear();
  for (int i = 0; i < c.num_layers; ++i) c.layer_sliding.push_back(i % 2 == 0);
  return c;
}

json GptOssConfig::to_json() const {
  json lt = json::array();
  for (bool s : layer_sliding) lt.push_back(s ? "sliding_attention" : "full_attention");
  return json{
      {"architectures", {"GptOssForCausalLM"}},
      {"attention_bias", true},
      {"attention_dropout", 0.0},
      {"eos_token_id", eos_token_id},
      {"pad_token_id", pad_token_id},
      {"experts_per_token", experts_per_token},
      {"num_experts_per_tok", experts_per_token},
      {"head_dim", head_dim},
      {"hidden_act", "silu"},
      {"hidden_size", hidden},
      {"initial_context_length", 4096},
      {"initializer_range", 0.02},
      {"intermediate_size", intermediate},
      {"layer_types", lt},
      {"max_position_embeddings", max_position_embeddings},
      {"model_type", "gpt_oss"},
      {"num_attention_heads", num_heads},
      {"num_hidden_layers", num_layers},
      {"num_key_value_heads", num_kv_heads},
      {"num_local_experts", num_experts},
      {"output_router_logits", false},
      {"quantization_config",
       {{"modules_to_not_convert",
         {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}},
        {"quant_method", "mxfp4"}}},
      {"rms_norm_eps", rms_eps},
      {"rope_scaling",
       {{"beta_fast", rope.beta_fast},
        {"beta_slow", rope.beta_slow},
        {"factor", rope.factor},
        {"original_max_position_embeddings", int(rope.original_max_position)},
        {"rope_type", "yarn"},
        {"truncate", rope.truncate}}},
      {"rope_theta", rope.theta},
      {"router_aux_loss_coef", 0.9},
      {"sliding_window", sliding_window},
      {"swiglu_limit", swiglu_limit},
      {"tie_word_embeddings", false},
      {"torch_dtype", "bfloat16"},
      {"use_cache", true},
      {"vocab_size", vocab},
  };
}

YarnTables compute_yarn(const GptOssConfig& c) {
  // Mirrors transformers' _compute_yarn_parameters: float32 tensors where torch uses them,
  // Python floats (double) for the scalar ramp bounds.
  const int dim = c.head_dim;
  const double base = c.rope.theta, factor = c.rope.factor;
  YarnTables t;
  t.attention_scaling = factor <= 1 ? 1.0f : float(0.1 * std::log(factor) + 1.0);
  auto correction_dim = [&](double rot) {
    return (dim * std::log(c.rope.original_max_position / (rot * 2 * M_PI))) / (2 * std::log(base));
  };
  double low = correction_dim(c.rope.beta_fast), high = correction_dim(c.rope.beta_slow);
  if (c.rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(dim - 1));
  if (low == high) high += 0.001;
  const int half = dim / 2;
  t.inv_freq.resize(half);
  for (int i = 0; i < half; ++i) {
    float expo = float(2 * i) / float(dim);                 // arange(0, dim, 2).float() / dim
    float pos_freq = std::pow(float(base), expo);           // base ** (...), float32
    float extrap = 1.0f / pos_freq;
    float interp = 1.0f / (float(factor) * pos_freq);
    float ramp = (float(i) - float(low)) / (float(high) - float(low));
    ramp = std::min(std::max(ramp, 0.0f), 1.0f);
    float extrap_factor = 1.0f - ramp;
    t.inv_freq[i] = interp * (1.0f - extrap_factor) + extrap * extrap_factor;
  }
  if (factor <= 1) {
    for (int i = 0; i < half; ++i) t.inv_freq[i] = 1.0f / std::pow(float(base), float(2 * i) / float(dim));
  }
  return t;
}

}  // namespace gptoss
