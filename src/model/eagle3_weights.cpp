#include "model/eagle3_weights.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "model/json_keys.h"

namespace gptoss {

namespace fs = std::filesystem;
using nlohmann::json;

using json_keys::need;
using json_keys::want;

std::vector<int> Eagle3Config::tap_layers(int L) const {
  std::vector<int> t = aux_layers;
  if (t.empty()) t = {1, L / 2 - 1, L - 4};  // SGLang captures the inputs of layers 2, L/2, L-3
  if (t.size() != 3) throw Error("eagle3: expected 3 auxiliary layer ids, got " + std::to_string(t.size()));
  for (int l : t)
    if (l < 0 || l >= L)
      throw Error("eagle3: auxiliary layer id " + std::to_string(l) + " is outside the target's " + std::to_string(L) +
                  " layers");
  return t;
}

Eagle3Config Eagle3Config::from_json(const json& j, const std::string& where) {
  if (!j.is_object()) throw Error(where + ": not a JSON object");
  Eagle3Config c;
  if (j.contains("architectures") && j["architectures"].is_array()) {
    bool ok = false;
    for (auto& a : j["architectures"]) ok |= a.is_string() && a.get<std::string>().find("Eagle3") != std::string::npos;
    if (!ok) throw Error(where + ": architectures " + j["architectures"].dump() + " is not an Eagle3 head (expected LlamaForCausalLMEagle3)");
  }
  c.hidden = need<int>(j, "hidden_size", where);
  c.num_heads = need<int>(j, "num_attention_heads", where);
  c.num_kv_heads = want<int>(j, "num_key_value_heads", c.num_heads, where);
  c.head_dim = want<int>(j, "head_dim", c.num_heads > 0 ? c.hidden / c.num_heads : 0, where);
  c.intermediate = need<int>(j, "intermediate_size", where);
  c.vocab = need<int>(j, "vocab_size", where);
  c.draft_vocab = want<int>(j, "draft_vocab_size", c.vocab, where);
  c.target_hidden = want<int>(j, "target_hidden_size", c.hidden, where);
  c.rms_eps = want<float>(j, "rms_norm_eps", 1e-6f, where);  // LlamaConfig's default
  c.rope_theta = want<double>(j, "rope_theta", 10000.0, where);
  c.norm_before_residual = want<bool>(j, "norm_before_residual", false, where);
  const int layers = want<int>(j, "num_hidden_layers", 1, where);
  if (layers != 1) throw Error(where + ": num_hidden_layers is " + std::to_string(layers) + "; only one-layer Eagle3 heads are supported");
  if (want<bool>(j, "attention_bias", false, where) || want<bool>(j, "mlp_bias", false, where))
    throw Error(where + ": attention_bias / mlp_bias heads are not supported");
  if (auto act = want<std::string>(j, "hidden_act", "silu", where); act != "silu")
    throw Error(where + ": hidden_act \"" + act + "\" is not supported (expected silu)");
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    const json& r = j["rope_scaling"];
    const std::string type = r.contains("rope_type") ? want<std::string>(r, "rope_type", "", where)
                                                     : want<std::string>(r, "type", "", where);
    if (type == "yarn") {
      c.rope_yarn = true;
      c.yarn.theta = c.rope_theta;
      c.yarn.factor = need<double>(r, "factor", where + " rope_scaling");
      c.yarn.original_max_position = need<double>(r, "original_max_position_embeddings", where + " rope_scaling");
      c.yarn.beta_fast = want<double>(r, "beta_fast", 32.0, where);
      c.yarn.beta_slow = want<double>(r, "beta_slow", 1.0, where);
      c.yarn.truncate = want<bool>(r, "truncate", true, where);
    } else if (type != "default" && !type.empty()) {
      throw Error(where + ": rope_scaling type \"" + type + "\" is not supported (default or yarn)");
    }
  }
  if (j.contains("eagle_config") && j["eagle_config"].is_object()) {
    const json& e = j["eagle_config"];
    if (!want<bool>(e, "use_aux_hidden_state", true, where))
      throw Error(where + ": eagle_config.use_aux_hidden_state is false (an Eagle1-style head); only Eagle3 heads are supported");
    c.aux_layers = want<std::vector<int>>(e, "eagle_aux_hidden_state_layer_ids", {}, where);
  } else if (j.contains("eagle_aux_hidden_state_layer_ids")) {  // speculators-style flat config
    c.aux_layers = want<std::vector<int>>(j, "eagle_aux_hidden_state_layer_ids", {}, where);
  }
  if (!c.aux_layers.empty() && c.aux_layers.size() != 3)
    throw Error(where + ": eagle_aux_hidden_state_layer_ids must list 3 layers, got " + std::to_string(c.aux_layers.size()));
  for (auto [v, key] : {std::pair{c.hidden, "hidden_size"}, {c.num_heads, "num_attention_heads"},
                        {c.num_kv_heads, "num_key_value_heads"}, {c.head_dim, "head_dim"},
                        {c.intermediate, "intermediate_size"}, {c.vocab, "vocab_size"},
                        {c.draft_vocab, "draft_vocab_size"}, {c.target_hidden, "target_hidden_size"}})
    if (v <= 0) throw Error(where + ": \"" + key + "\" must be positive");
  if (c.num_heads % c.num_kv_heads) throw Error(where + ": num_attention_heads must be a multiple of num_key_value_heads");
  if (c.head_dim % 2) throw Error(where + ": head_dim must be even");
  if (c.draft_vocab > c.vocab) throw Error(where + ": draft_vocab_size is larger than vocab_size");
  return c;
}

Eagle3Config Eagle3Config::from_file(const std::string& path) {
  return from_json(read_json_file(path, " (an Eagle3 head directory needs config.json)"), path);
}

Eagle3Config Eagle3Config::preset(const std::string& name) {
  Eagle3Config c;  // the defaults are SpecForge's gpt-oss-120B-eagle3.json
  if (name == "eagle3-120b") {
    c.aux_layers = {1, 17, 33};
  } else if (name == "eagle3-20b") {
    c.aux_layers = {1, 11, 20};  // the default rule for 24 layers
  } else if (name == "eagle3-tiny") {
    // Against the built-in tiny target (hidden 128, 2 layers, the real vocabulary).
    c.hidden = 128;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 32;
    c.intermediate = 256;
    c.draft_vocab = 512;
    c.target_hidden = 128;
    c.aux_layers = {0, 1, 1};
  } else {
    throw Error("unknown Eagle3 preset \"" + name + "\" (expected eagle3-120b, eagle3-20b or eagle3-tiny)");
  }
  return c;
}

json Eagle3Config::to_json() const {
  json j = {{"architectures", {"LlamaForCausalLMEagle3"}},
            {"model_type", "llama"},
            {"eagle_config", {{"eagle_aux_hidden_state_layer_ids", aux_layers}, {"use_aux_hidden_state", true}}},
            {"hidden_size", hidden},
            {"num_attention_heads", num_heads},
            {"num_key_value_heads", num_kv_heads},
            {"head_dim", head_dim},
            {"intermediate_size", intermediate},
            {"num_hidden_layers", 1},
            {"hidden_act", "silu"},
            {"vocab_size", vocab},
            {"draft_vocab_size", draft_vocab},
            {"target_hidden_size", target_hidden},
            {"rms_norm_eps", rms_eps},
            {"rope_theta", rope_theta},
            {"max_position_embeddings", 4096},
            {"attention_bias", false},
            {"tie_word_embeddings", false},
            {"torch_dtype", "bfloat16"}};
  if (rope_yarn)
    j["rope_scaling"] = {{"rope_type", "yarn"},
                         {"factor", yarn.factor},
                         {"original_max_position_embeddings", yarn.original_max_position},
                         {"beta_fast", yarn.beta_fast},
                         {"beta_slow", yarn.beta_slow},
                         {"truncate", yarn.truncate}};
  else
    j["rope_scaling"] = nullptr;
  return j;
}

std::shared_ptr<const Eagle3Weights> Eagle3Weights::load(const std::string& dir) {
  if (!fs::is_directory(dir)) throw Error(dir + ": not an Eagle3 head directory");
  auto w = std::make_shared<Eagle3Weights>();
  w->config = Eagle3Config::from_file((fs::path(dir) / "config.json").string());
  w->checkpoint = std::make_shared<Checkpoint>(dir);
  const Eagle3Config& c = w->config;
  const Checkpoint& ck = *w->checkpoint;
  const std::string layer = ck.find("midlayer.input_layernorm.weight") || !ck.find("layers.0.input_layernorm.weight")
                                ? "midlayer."
                                : "layers.0.";
  auto get = [&](const std::string& name, std::vector<int64_t> shape, bool matrix) -> const TensorView* {
    const TensorView& t = ck.get(name);
    const bool ok = matrix ? t.dtype == DType::BF16
                           : t.dtype == DType::BF16 || t.dtype == DType::F32 || t.dtype == DType::F16;
    if (!ok)
      throw Error(t.file + ": tensor " + name + " has dtype " + dtype_name(t.dtype) + ", expected " +
                  (matrix ? "BF16" : "BF16, F16 or F32"));
    if (t.shape != shape) {
      TensorView e;
      e.shape = shape;
      throw Error(t.file + ": tensor " + name + " has shape " + t.shape_str() + ", expected " + e.shape_str());
    }
    return &t;
  };
  const int64_t H = c.hidden, Q = int64_t(c.num_heads) * c.head_dim, KV = int64_t(c.num_kv_heads) * c.head_dim;
  w->fc = get("fc.weight", {H, 3 * int64_t(c.target_hidden)}, true);
  w->input_norm = get(layer + "input_layernorm.weight", {H}, false);
  w->hidden_norm = get(layer + "hidden_norm.weight", {H}, false);
  w->q = get(layer + "self_attn.q_proj.weight", {Q, 2 * H}, true);
  w->k = get(layer + "self_attn.k_proj.weight", {KV, 2 * H}, true);
  w->v = get(layer + "self_attn.v_proj.weight", {KV, 2 * H}, true);
  w->o = get(layer + "self_attn.o_proj.weight", {H, Q}, true);
  w->post_norm = get(layer + "post_attention_layernorm.weight", {H}, false);
  w->gate = get(layer + "mlp.gate_proj.weight", {c.intermediate, H}, true);
  w->up = get(layer + "mlp.up_proj.weight", {c.intermediate, H}, true);
  w->down = get(layer + "mlp.down_proj.weight", {H, c.intermediate}, true);
  w->norm = get("norm.weight", {H}, false);
  w->lm_head = get("lm_head.weight", {c.draft_vocab, H}, true);
  if (ck.find("embed_tokens.weight")) w->embed = get("embed_tokens.weight", {c.vocab, H}, true);
  if (const TensorView* t2d = ck.find("t2d")) {
    if (t2d->shape != std::vector<int64_t>{c.vocab})
      throw Error(t2d->file + ": tensor t2d has shape " + t2d->shape_str() + ", expected [" + std::to_string(c.vocab) + "]");
  }
  w->draft_to_target.resize(c.draft_vocab);
  if (const TensorView* d2t = ck.find("d2t")) {
    if (d2t->dtype != DType::I64 && d2t->dtype != DType::I32)
      throw Error(d2t->file + ": tensor d2t has dtype " + dtype_name(d2t->dtype) + ", expected I64");
    if (d2t->shape != std::vector<int64_t>{c.draft_vocab})
      throw Error(d2t->file + ": tensor d2t has shape " + d2t->shape_str() + ", expected [" + std::to_string(c.draft_vocab) + "]");
    for (int i = 0; i < c.draft_vocab; ++i) {
      int64_t off;
      if (d2t->dtype == DType::I64) std::memcpy(&off, d2t->data + 8 * size_t(i), 8);
      else {
        int32_t o32;
        std::memcpy(&o32, d2t->data + 4 * size_t(i), 4);
        off = o32;
      }
      const int64_t t = i + off;
      if (t < 0 || t >= c.vocab)
        throw Error(d2t->file + ": d2t maps draft id " + std::to_string(i) + " to target id " + std::to_string(t) +
                    ", outside the vocabulary of " + std::to_string(c.vocab));
      w->draft_to_target[i] = int32_t(t);
    }
  } else {
    if (c.draft_vocab != c.vocab)
      throw Error(dir + ": no d2t tensor, but draft_vocab_size (" + std::to_string(c.draft_vocab) +
                  ") differs from vocab_size (" + std::to_string(c.vocab) + ")");
    for (int i = 0; i < c.draft_vocab; ++i) w->draft_to_target[i] = i;
  }
  return w;
}

namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

void make_random_eagle3(const Eagle3Config& c, const std::string& out_dir, uint64_t seed, bool with_embed) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw Error(out_dir + ": cannot create directory: " + ec.message());
  struct Entry {
    TensorSpec spec;
    float std_;  // < 0: 1 + N(0, -std_) (norms)
  };
  const int64_t H = c.hidden, Q = int64_t(c.num_heads) * c.head_dim, KV = int64_t(c.num_kv_heads) * c.head_dim,
                I = c.intermediate;
  std::vector<Entry> all;
  auto bf = [&](std::string n, std::vector<int64_t> shape, float sd) {
    all.push_back({{std::move(n), DType::BF16, std::move(shape)}, sd});
  };
  if (with_embed) bf("embed_tokens.weight", {c.vocab, H}, 1.0f);
  bf("fc.weight", {H, 3 * int64_t(c.target_hidden)}, 0.02f);
  bf("midlayer.input_layernorm.weight", {H}, -0.1f);
  bf("midlayer.hidden_norm.weight", {H}, -0.1f);
  bf("midlayer.self_attn.q_proj.weight", {Q, 2 * H}, 0.02f);
  bf("midlayer.self_attn.k_proj.weight", {KV, 2 * H}, 0.02f);
  bf("midlayer.self_attn.v_proj.weight", {KV, 2 * H}, 0.02f);
  bf("midlayer.self_attn.o_proj.weight", {H, Q}, 0.02f);
  bf("midlayer.post_attention_layernorm.weight", {H}, -0.1f);
  bf("midlayer.mlp.gate_proj.weight", {I, H}, 0.02f);
  bf("midlayer.mlp.up_proj.weight", {I, H}, 0.02f);
  bf("midlayer.mlp.down_proj.weight", {H, I}, 0.02f);
  bf("norm.weight", {H}, -0.1f);
  bf("lm_head.weight", {c.draft_vocab, H}, 0.02f);
  all.push_back({{"d2t", DType::I64, {c.draft_vocab}}, 0});
  all.push_back({{"t2d", DType::BOOL, {c.vocab}}, 0});
  const int64_t stride = c.vocab / c.draft_vocab;
  std::vector<TensorSpec> specs;
  for (auto& e : all) specs.push_back(e.spec);
  write_safetensors((fs::path(out_dir) / "model.safetensors").string(), specs, [&](const TensorSpec& s, uint8_t* out) {
    if (s.name == "d2t") {
      for (int64_t i = 0; i < c.draft_vocab; ++i) {
        const int64_t off = i * stride - i;
        std::memcpy(out + 8 * i, &off, 8);
      }
      return;
    }
    if (s.name == "t2d") {
      std::memset(out, 0, s.nbytes());
      for (int64_t i = 0; i < c.draft_vocab; ++i) out[i * stride] = 1;
      return;
    }
    float sd = 0;
    for (auto& e : all)
      if (e.spec.name == s.name) sd = e.std_;
    uint64_t st = seed * 0x9e3779b97f4a7c15ull;
    for (unsigned char ch : s.name) st = (st ^ ch) * 1099511628211ull;
    const size_t n = s.nbytes() / 2;
    for (size_t i = 0; i < n; ++i) {
      double u1 = (double(splitmix64(st) >> 11) + 1.0) / 9007199254740993.0;
      double u2 = double(splitmix64(st) >> 11) / 9007199254740992.0;
      float z = float(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
      float v = sd < 0 ? 1.0f + (-sd) * z : sd * z;
      uint16_t b = f32_to_bf16(v);
      std::memcpy(out + 2 * i, &b, 2);
    }
  });
  std::ofstream(fs::path(out_dir) / "config.json") << c.to_json().dump(2) << "\n";
}

}  // namespace gptoss
