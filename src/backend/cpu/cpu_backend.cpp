#include "backend/cpu/cpu_backend.h"
#include "backend/kv_layout.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "common/error.h"

namespace gptoss {

namespace {

std::vector<float> to_floats(const TensorView& t) {
  std::vector<float> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = tensor_float_at(t, i);
  return v;
}

const uint16_t* bf16_data(const TensorView& t) { return reinterpret_cast<const uint16_t*>(t.data); }

struct CpuLayer {
  std::vector<float> attn_norm, mlp_norm, q_b, k_b, v_b, o_b, sinks, router_b, gate_up_bias, down_bias;
  bool sliding;
  int group_index;  // index of this layer inside its KV group
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(std::shared_ptr<const ModelWeights> w, int threads) : w_(std::move(w)), c_(w_->config) {
    if (threads > 0) omp_set_num_threads(threads);
    yarn_ = compute_yarn(c_);
    final_norm_ = to_floats(*w_->final_norm);
    int idx[2] = {0, 0};
    for (int l = 0; l < c_.num_layers; ++l) {
      const LayerWeights& L = w_->layers[l];
      CpuLayer cl;
      cl.attn_norm = to_floats(*L.attn_norm);
      cl.mlp_norm = to_floats(*L.mlp_norm);
      cl.q_b = to_floats(*L.q_b);
      cl.k_b = to_floats(*L.k_b);
      cl.v_b = to_floats(*L.v_b);
      cl.o_b = to_floats(*L.o_b);
      cl.sinks = to_floats(*L.sinks);
      cl.router_b = to_floats(*L.router_b);
      cl.gate_up_bias = to_floats(*L.gate_up_bias);
      cl.down_bias = to_floats(*L.down_bias);
      cl.sliding = c_.layer_sliding[l];
      cl.group_index = idx[cl.sliding ? kKvSliding : kKvFull]++;
      layers_.push_back(std::move(cl));
    }
  }

  std::string name() const override { return "cpu"; }
  bool supports_hidden_taps() const override { return true; }
  const GptOssConfig& config() const override { return c_; }
  const KvCacheConfig& kv_config() const override { return kv_; }

  void init_kv_cache(const KvCacheConfig& kv) override {
    if (kv.page_size <= 0) throw Error("KV cache page size must be positive");
    if (kv.dtype != DType::BF16 && kv.dtype != DType::F8_E4M3 && kv.dtype != DType::F32)
      throw Error("KV cache dtype must be bf16 or fp8");
    kv_ = kv;
    for (int g = 0; g < 2; ++g) {
      int layers = g == kKvSliding ? c_.num_sliding_layers() : c_.num_full_layers();
      cache_[g].assign(size_t(layers) * kv.num_pages[g] * 2 * kv.page_size * c_.kv_dim(), 0.0f);
    }
  }

  void forward(const ForwardBatch& b, float* logits) override {
    const int n = int(b.tokens.size());
    if (n == 0) return;
    const int H = c_.hidden, V = c_.vocab;
    std::vector<int32_t> positions(n);
    for (auto& s : b.seqs) {
      if (s.first_token < 0 || s.n_tokens < 0 || s.first_token + s.n_tokens > n)
        throw Error("forward: sequence token range outside the batch");
      for (int i = 0; i < s.n_tokens; ++i) positions[s.first_token + i] = s.start_pos + i;
    }
    for (int32_t t : b.tokens)
      if (t < 0 || t >= V) throw Error("forward: token id " + std::to_string(t) + " outside the vocabulary");

    std::vector<float> x(size_t(n) * H);
    for (int i = 0; i < n; ++i) {
      const uint16_t* e = bf16_data(*w_->embed) + size_t(b.tokens[i]) * H;
      for (int j = 0; j < H; ++j) x[size_t(i) * H + j] = bf16_to_f32(e[j]);
    }
    for (int32_t l : b.tap_layers)
      if (l < 0 || l >= c_.num_layers) throw Error("forward: tapped layer " + std::to_string(l) + " does not exist");
    if (!b.tap_layers.empty() && !b.tap_out) throw Error("forward: hidden-state taps asked without an output buffer");
    for (int l = 0; l < c_.num_layers; ++l) {
      attention_block(l, b, positions, x);
      moe_block(l, n, x);
      tap(b, l, x);
    }
    const int rows = int(b.logit_rows.size());
    std::vector<float> xr(size_t(rows) * H), h(size_t(rows) * H);
    for (int r = 0; r < rows; ++r) {
      int t = b.logit_rows[r];
      if (t < 0 || t >= n) throw Error("forward: logit row outside the batch");
      std::copy_n(&x[size_t(t) * H], H, &xr[size_t(r) * H]);
    }
    cpu::rmsnorm(xr.data(), final_norm_.data(), rows, H, c_.rms_eps, h.data());
    cpu::linear_bf16(h.data(), rows, H, bf16_data(*w_->lm_head), V, nullptr, logits);
  }

 private:
  // Copies the residual stream after layer l into every tap slot that names it.
  void tap(const ForwardBatch& b, int l, const std::vector<float>& x) {
    const int n = int(b.tokens.size()), H = c_.hidden, slots = int(b.tap_layers.size());
    for (int i = 0; i < slots; ++i)
      if (b.tap_layers[i] == l)
        for (int t = 0; t < n; ++t) std::copy_n(&x[size_t(t) * H], H, b.tap_out + (size_t(t) * slots + i) * H);
  }

  // Storage of one K or V row of layer l at `pos` of a sequence.
  float* kv_row(const CpuLayer& L, const SeqBatchInfo& s, int pos, int which) {
    const int g = L.sliding ? kKvSliding : kKvFull;
    const int pi = pos / kv_.page_size;
    if (pi >= s.n_pages[g] || s.pages[g][pi] < 0 || s.pages[g][pi] >= kv_.num_pages[g])
      throw Error("forward: no KV page for position " + std::to_string(pos));
    const PagedKvLayout lay{kv_.page_size, c_.num_kv_heads, c_.head_dim};
    const size_t off = lay.layer_offset(L.group_index, kv_.num_pages[g]) +
                       lay.offset(s.pages[g][pi], which, pos % kv_.page_size, 0, 0);
    return &cache_[g][off];
  }

  void store(float* dst, const float* src) {
    const int d = c_.kv_dim();
    if (kv_.dtype == DType::F8_E4M3)
      for (int i = 0; i < d; ++i) dst[i] = fp8_e4m3_to_f32(f32_to_fp8_e4m3(src[i]));
    else
      std::copy_n(src, d, dst);  // the reference keeps K/V exact
  }

  void attention_block(int l, const ForwardBatch& b, const std::vector<int32_t>& positions, std::vector<float>& x) {
    const LayerWeights& W = w_->layers[l];
    const CpuLayer& L = layers_[l];
    const int n = int(b.tokens.size()), H = c_.hidden, Q = c_.q_dim(), K = c_.kv_dim(), D = c_.head_dim;
    std::vector<float> h(size_t(n) * H), q(size_t(n) * Q), k(size_t(n) * K), v(size_t(n) * K), a(size_t(n) * Q),
        o(size_t(n) * H);
    cpu::rmsnorm(x.data(), L.attn_norm.data(), n, H, c_.rms_eps, h.data());
    cpu::linear_bf16(h.data(), n, H, bf16_data(*W.q_w), Q, L.q_b.data(), q.data());
    cpu::linear_bf16(h.data(), n, H, bf16_data(*W.k_w), K, L.k_b.data(), k.data());
    cpu::linear_bf16(h.data(), n, H, bf16_data(*W.v_w), K, L.v_b.data(), v.data());
    cpu::rope(q.data(), n, c_.num_heads, D, positions.data(), yarn_);
    cpu::rope(k.data(), n, c_.num_kv_heads, D, positions.data(), yarn_);
    const int window = L.sliding ? c_.sliding_window : 0;
    std::vector<float> ks, vs;
    for (auto& s : b.seqs) {
      for (int i = 0; i < s.n_tokens; ++i) {
        int t = s.first_token + i;
        store(kv_row(L, s, positions[t], 0), &k[size_t(t) * K]);
        store(kv_row(L, s, positions[t], 1), &v[size_t(t) * K]);
      }
      if (s.n_tokens == 0) continue;
      // Gather the keys any of this sequence's queries can see into contiguous rows.
      const int end = s.start_pos + s.n_tokens;
      const int first = window > 0 ? std::max(0, s.start_pos - window + 1) : 0;
      ks.resize(size_t(end - first) * K);
      vs.resize(size_t(end - first) * K);
      for (int p = first; p < end; ++p) {
        std::copy_n(kv_row(L, s, p, 0), K, &ks[size_t(p - first) * K]);
        std::copy_n(kv_row(L, s, p, 1), K, &vs[size_t(p - first) * K]);
      }
      cpu::attention(&q[size_t(s.first_token) * Q], s.n_tokens, s.start_pos, ks.data(), vs.data(), first,
                     end - first, c_.num_heads, c_.num_kv_heads, D, window, L.sinks.data(),
                     &a[size_t(s.first_token) * Q]);
    }
    cpu::linear_bf16(a.data(), n, Q, bf16_data(*W.o_w), H, L.o_b.data(), o.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
  }

  void moe_block(int l, int n, std::vector<float>& x) {
    const LayerWeights& W = w_->layers[l];
    const CpuLayer& L = layers_[l];
    const int H = c_.hidden, E = c_.num_experts, k = c_.experts_per_token, I = c_.intermediate;
    std::vector<float> h(size_t(n) * H), rl(size_t(n) * E), rw(size_t(n) * k);
    std::vector<int32_t> ri(size_t(n) * k);
    cpu::rmsnorm(x.data(), L.mlp_norm.data(), n, H, c_.rms_eps, h.data());
    cpu::linear_bf16(h.data(), n, H, bf16_data(*W.router_w), E, L.router_b.data(), rl.data());
    cpu::router_topk(rl.data(), n, E, k, ri.data(), rw.data());

    // Group (token, slot) pairs by expert so each expert's weights are decoded once per step.
    std::vector<std::vector<int>> by_expert(E);
    for (int i = 0; i < n * k; ++i) by_expert[ri[i]].push_back(i);
    std::vector<float> y(size_t(n) * k * H);  // per (token, slot) expert output
    std::vector<float> xs, gu, act, out;
    const size_t gu_blocks = size_t(2) * I * H / 2, gu_scales = size_t(2) * I * H / 32;
    const size_t dn_blocks = size_t(H) * I / 2, dn_scales = size_t(H) * I / 32;
    for (int e = 0; e < E; ++e) {
      const auto& rows = by_expert[e];
      const int m = int(rows.size());
      if (!m) continue;
      xs.resize(size_t(m) * H);
      for (int r = 0; r < m; ++r) std::copy_n(&h[size_t(rows[r] / k) * H], H, &xs[size_t(r) * H]);
      gu.resize(size_t(m) * 2 * I);
      act.resize(size_t(m) * I);
      out.resize(size_t(m) * H);
      cpu::linear_mxfp4(xs.data(), m, H, W.gate_up_blocks->data + e * gu_blocks, W.gate_up_scales->data + e * gu_scales,
                        2 * I, &L.gate_up_bias[size_t(e) * 2 * I], gu.data());
      cpu::swiglu(gu.data(), m, I, c_.swiglu_limit, act.data());
      cpu::linear_mxfp4(act.data(), m, I, W.down_blocks->data + e * dn_blocks, W.down_scales->data + e * dn_scales, H,
                        &L.down_bias[size_t(e) * H], out.data());
      for (int r = 0; r < m; ++r) std::copy_n(&out[size_t(r) * H], H, &y[size_t(rows[r]) * H]);
    }
    for (int t = 0; t < n; ++t)
      for (int j = 0; j < k; ++j) {
        const float w = rw[t * k + j];
        const float* yr = &y[(size_t(t) * k + j) * H];
        for (int d = 0; d < H; ++d) x[size_t(t) * H + d] += w * yr[d];
      }
  }

  std::shared_ptr<const ModelWeights> w_;
  const GptOssConfig& c_;
  YarnTables yarn_;
  std::vector<float> final_norm_;
  std::vector<CpuLayer> layers_;
  KvCacheConfig kv_;
  std::vector<float> cache_[2];
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(std::shared_ptr<const ModelWeights> weights, int threads) {
  return std::make_unique<CpuBackend>(std::move(weights), threads);
}

}  // namespace gptoss
