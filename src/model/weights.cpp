#include "model/weights.h"

#include <filesystem>

#include "common/error.h"

namespace gptoss {

float tensor_float_at(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::F32: return reinterpret_cast<const float*>(t.data)[i];
    case DType::BF16: return bf16_to_f32(reinterpret_cast<const uint16_t*>(t.data)[i]);
    case DType::F16: return f16_to_f32(reinterpret_cast<const uint16_t*>(t.data)[i]);
    default: throw Error(t.file + ": tensor " + t.name + " is not a float tensor");
  }
}

namespace {

struct Checker {
  const Checkpoint& ck;
  const TensorView* operator()(const std::string& name, std::vector<int64_t> shape,
                               std::initializer_list<DType> dtypes) const {
    const TensorView& t = ck.get(name);
    bool ok = false;
    for (DType d : dtypes) ok |= t.dtype == d;
    if (!ok) {
      std::string want;
      for (DType d : dtypes) want += std::string(want.empty() ? "" : " or ") + dtype_name(d);
      throw Error(t.file + ": tensor " + name + " has dtype " + dtype_name(t.dtype) + ", expected " + want);
    }
    if (t.shape != shape) {
      TensorView w;
      w.shape = shape;
      throw Error(t.file + ": tensor " + name + " has shape " + t.shape_str() + ", expected " + w.shape_str());
    }
    return &t;
  }
};

}  // namespace

std::shared_ptr<const ModelWeights> ModelWeights::load(const std::string& dir, const LoadProgressFn& progress) {
  namespace fs = std::filesystem;
  auto w = std::make_shared<ModelWeights>();
  w->config = GptOssConfig::from_file((fs::path(dir) / "config.json").string());
  w->checkpoint = std::make_shared<Checkpoint>(dir);
  const GptOssConfig& c = w->config;
  Checker chk{*w->checkpoint};
  const auto BF = {DType::BF16};
  const auto FLT = {DType::BF16, DType::F32, DType::F16};  // small vectors: converted checkpoints differ
  const auto U8 = {DType::U8};
  const int64_t H = c.hidden, V = c.vocab, E = c.num_experts, I = c.intermediate;
  w->embed = chk("model.embed_tokens.weight", {V, H}, BF);
  w->final_norm = chk("model.norm.weight", {H}, FLT);
  w->lm_head = chk("lm_head.weight", {V, H}, BF);
  for (int l = 0; l < c.num_layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights L;
    L.attn_norm = chk(p + "input_layernorm.weight", {H}, FLT);
    L.mlp_norm = chk(p + "post_attention_layernorm.weight", {H}, FLT);
    L.q_w = chk(p + "self_attn.q_proj.weight", {c.q_dim(), H}, BF);
    L.q_b = chk(p + "self_attn.q_proj.bias", {c.q_dim()}, FLT);
    L.k_w = chk(p + "self_attn.k_proj.weight", {c.kv_dim(), H}, BF);
    L.k_b = chk(p + "self_attn.k_proj.bias", {c.kv_dim()}, FLT);
    L.v_w = chk(p + "self_attn.v_proj.weight", {c.kv_dim(), H}, BF);
    L.v_b = chk(p + "self_attn.v_proj.bias", {c.kv_dim()}, FLT);
    L.o_w = chk(p + "self_attn.o_proj.weight", {H, c.q_dim()}, BF);
    L.o_b = chk(p + "self_attn.o_proj.bias", {H}, FLT);
    L.sinks = chk(p + "self_attn.sinks", {c.num_heads}, FLT);
    L.router_w = chk(p + "mlp.router.weight", {E, H}, BF);
    L.router_b = chk(p + "mlp.router.bias", {E}, FLT);
    L.gate_up_blocks = chk(p + "mlp.experts.gate_up_proj_blocks", {E, 2 * I, H / 32, 16}, U8);
    L.gate_up_scales = chk(p + "mlp.experts.gate_up_proj_scales", {E, 2 * I, H / 32}, U8);
    L.gate_up_bias = chk(p + "mlp.experts.gate_up_proj_bias", {E, 2 * I}, FLT);
    L.down_blocks = chk(p + "mlp.experts.down_proj_blocks", {E, H, I / 32, 16}, U8);
    L.down_scales = chk(p + "mlp.experts.down_proj_scales", {E, H, I / 32}, U8);
    L.down_bias = chk(p + "mlp.experts.down_proj_bias", {E, H}, FLT);
    w->layers.push_back(L);
  }
  if (progress) w->checkpoint->read_all(progress);
  return w;
}

}  // namespace gptoss
