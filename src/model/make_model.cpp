#include "model/make_model.h"

#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "model/safetensors.h"

namespace gptoss {

namespace fs = std::filesystem;

namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t hash_name(const std::string& s, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

enum class Kind { Normal, OnePlusNormal, Nibbles, Scales };

// Fills `count` elements in chunks with their own RNG streams, so any thread count gives the
// same bytes.
void fill_tensor(const TensorSpec& s, uint8_t* out, uint64_t seed, Kind kind, float std_, const RandomWeightSpec& r) {
  const size_t count = kind == Kind::Nibbles || kind == Kind::Scales ? s.nbytes() : s.nbytes() / 2;
  const size_t chunk = 1 << 16;
  const uint64_t base = hash_name(s.name, seed);
  const int64_t nchunks = int64_t((count + chunk - 1) / chunk);
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t c = 0; c < nchunks; ++c) {
    uint64_t st = base ^ (uint64_t(c) * 0xd1b54a32d192ed03ull);
    const size_t lo = size_t(c) * chunk, hi = std::min(count, lo + chunk);
    for (size_t i = lo; i < hi; ++i) {
      if (kind == Kind::Nibbles) {
        out[i] = uint8_t(splitmix64(st));
      } else if (kind == Kind::Scales) {
        out[i] = uint8_t(r.scale_lo + splitmix64(st) % uint64_t(r.scale_hi - r.scale_lo + 1));
      } else {
        // Box-Muller from two 53-bit uniforms.
        double u1 = (double(splitmix64(st) >> 11) + 1.0) / 9007199254740993.0;
        double u2 = double(splitmix64(st) >> 11) / 9007199254740992.0;
        float z = float(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
        float v = kind == Kind::OnePlusNormal ? 1.0f + std_ * z : std_ * z;
        uint16_t b = f32_to_bf16(v);
        std::memcpy(out + 2 * i, &b, 2);
      }
    }
  }
}

}  // namespace

void LoopSpec::check(const GptOssConfig& c) const {
  if (tokens < 1 || tokens > c.hidden)
    throw Error("loop model: the cycle needs 1 to " + std::to_string(c.hidden) + " tokens (hidden size), not " +
                std::to_string(tokens));
  if (first_id < 0 || int64_t(first_id) + tokens > c.vocab)
    throw Error("loop model: token ids " + std::to_string(first_id) + ".." + std::to_string(first_id + tokens - 1) +
                " are not all in the vocabulary (" + std::to_string(c.vocab) + ")");
}

void LoopSpec::rows(int hidden, bool lm_head, const std::function<void(int64_t, const std::vector<uint16_t>&)>& set_row) const {
  for (int i = 0; i < tokens; ++i) {
    std::vector<uint16_t> v(size_t(hidden), 0);
    v[size_t(i)] = f32_to_bf16(lm_head ? head_scale : embed_scale);
    set_row(first_id + (lm_head ? (i + 1) % tokens : i), v);
  }
}

void make_random_model(const GptOssConfig& c, const std::string& out_dir, uint64_t seed, size_t shard_bytes,
                       const LoopSpec& loop) {
  if (loop.active()) loop.check(c);
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw Error(out_dir + ": cannot create directory: " + ec.message());
  const RandomWeightSpec r;
  struct Entry {
    TensorSpec spec;
    Kind kind;
    float std_;
  };
  std::vector<Entry> all;
  const int64_t H = c.hidden, V = c.vocab, E = c.num_experts, I = c.intermediate;
  auto bf = [&](std::string n, std::vector<int64_t> shape, Kind k, float sd) {
    all.push_back({{std::move(n), DType::BF16, std::move(shape)}, k, sd});
  };
  auto u8 = [&](std::string n, std::vector<int64_t> shape, Kind k) {
    all.push_back({{std::move(n), DType::U8, std::move(shape)}, k, 0});
  };
  bf("model.embed_tokens.weight", {V, H}, Kind::Normal, r.embed_std);
  for (int l = 0; l < c.num_layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    bf(p + "input_layernorm.weight", {H}, Kind::OnePlusNormal, r.norm_std);
    bf(p + "self_attn.q_proj.weight", {c.q_dim(), H}, Kind::Normal, r.dense_std);
    bf(p + "self_attn.q_proj.bias", {c.q_dim()}, Kind::Normal, r.bias_std);
    bf(p + "self_attn.k_proj.weight", {c.kv_dim(), H}, Kind::Normal, r.dense_std);
    bf(p + "self_attn.k_proj.bias", {c.kv_dim()}, Kind::Normal, r.bias_std);
    bf(p + "self_attn.v_proj.weight", {c.kv_dim(), H}, Kind::Normal, r.dense_std);
    bf(p + "self_attn.v_proj.bias", {c.kv_dim()}, Kind::Normal, r.bias_std);
    bf(p + "self_attn.o_proj.weight", {H, c.q_dim()}, Kind::Normal, r.dense_std);
    bf(p + "self_attn.o_proj.bias", {H}, Kind::Normal, r.bias_std);
    bf(p + "self_attn.sinks", {c.num_heads}, Kind::Normal, 1.0f);
    bf(p + "post_attention_layernorm.weight", {H}, Kind::OnePlusNormal, r.norm_std);
    bf(p + "mlp.router.weight", {E, H}, Kind::Normal, r.dense_std);
    bf(p + "mlp.router.bias", {E}, Kind::Normal, r.bias_std);
    u8(p + "mlp.experts.gate_up_proj_blocks", {E, 2 * I, H / 32, 16}, Kind::Nibbles);
    u8(p + "mlp.experts.gate_up_proj_scales", {E, 2 * I, H / 32}, Kind::Scales);
    bf(p + "mlp.experts.gate_up_proj_bias", {E, 2 * I}, Kind::Normal, r.bias_std);
    u8(p + "mlp.experts.down_proj_blocks", {E, H, I / 32, 16}, Kind::Nibbles);
    u8(p + "mlp.experts.down_proj_scales", {E, H, I / 32}, Kind::Scales);
    bf(p + "mlp.experts.down_proj_bias", {E, H}, Kind::Normal, r.bias_std);
  }
  bf("model.norm.weight", {H}, Kind::OnePlusNormal, r.norm_std);
  bf("lm_head.weight", {V, H}, Kind::Normal, r.dense_std);

  // Split into shards of about shard_bytes, in declaration order.
  std::vector<std::vector<const Entry*>> shards(1);
  size_t cur = 0, total = 0;
  for (auto& e : all) {
    if (cur > 0 && cur + e.spec.nbytes() > shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(&e);
    cur += e.spec.nbytes();
    total += e.spec.nbytes();
  }
  nlohmann::ordered_json wmap;
  const int ns = int(shards.size());
  for (int si = 0; si < ns; ++si) {
    char fn[64];
    std::snprintf(fn, sizeof fn, "model-%05d-of-%05d.safetensors", si, ns - 1);  // the published naming
    std::vector<TensorSpec> specs;
    for (auto* e : shards[si]) {
      specs.push_back(e->spec);
      wmap[e->spec.name] = fn;
    }
    write_safetensors((fs::path(out_dir) / fn).string(), specs, [&](const TensorSpec& s, uint8_t* out) {
      for (auto* e : shards[si])
        if (e->spec.name == s.name) fill_tensor(s, out, seed, e->kind, e->std_, r);
      const bool head = s.name == "lm_head.weight";
      if (loop.active() && (head || s.name == "model.embed_tokens.weight"))
        loop.rows(int(H), head, [&](int64_t row, const std::vector<uint16_t>& v) {
          std::memcpy(out + size_t(row) * H * 2, v.data(), v.size() * 2);
        });
    });
  }
  nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", wmap}};
  std::ofstream(fs::path(out_dir) / "model.safetensors.index.json") << index.dump(2) << "\n";
  std::ofstream(fs::path(out_dir) / "config.json") << c.to_json().dump(2) << "\n";
}

}  // namespace gptoss
