#include "engine/eagle3_drafter.h"

#include <cmath>

#include "backend/cpu/cpu_ops.h"
#include "common/error.h"
#include "model/weights.h"

namespace gptoss {

namespace {

std::vector<float> floats(const TensorView& t) {
  std::vector<float> v(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[size_t(i)] = tensor_float_at(t, i);
  return v;
}

const uint16_t* bf16(const TensorView* t) { return reinterpret_cast<const uint16_t*>(t->data); }

}  // namespace

Eagle3Drafter::Eagle3Drafter(std::shared_ptr<const Eagle3Weights> w, const GptOssConfig& target,
                             const TensorView* target_embed, std::shared_ptr<const void> keep_alive)
    : w_(std::move(w)), c_(w_->config), keep_alive_(std::move(keep_alive)) {
  if (c_.target_hidden != target.hidden)
    throw Error("eagle3: the head expects a target hidden size of " + std::to_string(c_.target_hidden) +
                ", the model has " + std::to_string(target.hidden));
  if (c_.vocab != target.vocab)
    throw Error("eagle3: the head's vocab_size " + std::to_string(c_.vocab) + " differs from the model's " +
                std::to_string(target.vocab));
  for (int l : c_.tap_layers(target.num_layers)) taps_.push_back(l);
  if (w_->embed) {
    embed_ = bf16(w_->embed);
  } else {
    if (!target_embed)
      throw Error("eagle3: the head has no embed_tokens.weight and the target's embedding is not available "
                  "(load the target from a checkpoint directory)");
    if (target_embed->dtype != DType::BF16 || target_embed->shape != std::vector<int64_t>{c_.vocab, c_.hidden})
      throw Error("eagle3: the head shares the target's embedding, which is " + target_embed->shape_str() +
                  "; expected [" + std::to_string(c_.vocab) + ", " + std::to_string(c_.hidden) + "] bf16");
    embed_ = bf16(target_embed);
  }
  if (c_.rope_yarn) {
    GptOssConfig r;
    r.head_dim = c_.head_dim;
    r.rope = c_.yarn;
    rope_ = compute_yarn(r);
  } else {
    rope_.attention_scaling = 1.0f;
    for (int i = 0; i < c_.head_dim / 2; ++i)
      rope_.inv_freq.push_back(float(1.0 / std::pow(c_.rope_theta, double(2 * i) / c_.head_dim)));
  }
  input_norm_ = floats(*w_->input_norm);
  hidden_norm_ = floats(*w_->hidden_norm);
  post_norm_ = floats(*w_->post_norm);
  norm_ = floats(*w_->norm);
  no_sinks_.assign(size_t(c_.num_heads), -INFINITY);
}

void Eagle3Drafter::run_rows(State& s, int32_t pos, int n, const int32_t* tokens, const float* h, float* out) const {
  const int H = c_.hidden, Q = c_.num_heads * c_.head_dim, KV = c_.num_kv_heads * c_.head_dim, I = c_.intermediate;
  const float eps = c_.rms_eps;
  std::vector<float> e(size_t(n) * H), cat(size_t(n) * 2 * H);
  for (int i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= c_.vocab) throw Error("eagle3: token id " + std::to_string(tokens[i]) + " outside the vocabulary");
    const uint16_t* row = embed_ + size_t(tokens[i]) * H;
    for (int j = 0; j < H; ++j) e[size_t(i) * H + j] = bf16_to_f32(row[j]);
  }
  std::vector<float> en(size_t(n) * H), hn(size_t(n) * H);
  cpu::rmsnorm(e.data(), input_norm_.data(), n, H, eps, en.data());
  cpu::rmsnorm(h, hidden_norm_.data(), n, H, eps, hn.data());
  for (int i = 0; i < n; ++i) {
    std::copy_n(&en[size_t(i) * H], H, &cat[size_t(i) * 2 * H]);
    std::copy_n(&hn[size_t(i) * H], H, &cat[size_t(i) * 2 * H + H]);
  }
  // Every row leaves its K/V for later rows; only the last row's output is used (one layer:
  // it seeds the proposals), so q, attention, o and the MLP run for that row alone.
  std::vector<float> k(size_t(n) * KV), v(size_t(n) * KV);
  cpu::linear_bf16(cat.data(), n, 2 * H, bf16(w_->k), KV, nullptr, k.data());
  cpu::linear_bf16(cat.data(), n, 2 * H, bf16(w_->v), KV, nullptr, v.data());
  std::vector<int32_t> positions(n);
  for (int i = 0; i < n; ++i) positions[i] = pos + i;
  cpu::rope(k.data(), n, c_.num_kv_heads, c_.head_dim, positions.data(), rope_);
  // The cache holds rows first_pos .. pos - 1; these rows follow.
  const size_t at = size_t(pos - s.first_pos);
  s.k.resize((at + n) * KV);
  s.v.resize((at + n) * KV);
  std::copy(k.begin(), k.end(), s.k.begin() + at * KV);
  std::copy(v.begin(), v.end(), s.v.begin() + at * KV);
  const float* last_cat = &cat[size_t(n - 1) * 2 * H];
  std::vector<float> q(Q), a(Q), o(H), resid(H);
  cpu::linear_bf16(last_cat, 1, 2 * H, bf16(w_->q), Q, nullptr, q.data());
  cpu::rope(q.data(), 1, c_.num_heads, c_.head_dim, &positions[n - 1], rope_);
  // The row sees the cache's rows first_pos .. its own position, no earlier ones: after a restart
  // at a late position (a prefix-cache hit) the head never saw those. cpu::attention with no
  // window sees keys from position 0, so it gets positions counted from first_pos (the rows'
  // index in the cache); RoPE is already applied at the absolute positions, and only relative
  // ones enter the scores.
  cpu::attention(q.data(), 1, int(at) + n - 1, s.k.data(), s.v.data(), 0, int(at) + n, c_.num_heads, c_.num_kv_heads,
                 c_.head_dim, 0, no_sinks_.data(), a.data());
  cpu::linear_bf16(a.data(), 1, Q, bf16(w_->o), H, nullptr, o.data());
  const float* r0 = c_.norm_before_residual ? &hn[size_t(n - 1) * H] : h + size_t(n - 1) * H;
  for (int j = 0; j < H; ++j) resid[j] = r0[j] + o[j];
  std::vector<float> x(H), g(I), u(I);
  cpu::rmsnorm(resid.data(), post_norm_.data(), 1, H, eps, x.data());
  cpu::linear_bf16(x.data(), 1, H, bf16(w_->gate), I, nullptr, g.data());
  cpu::linear_bf16(x.data(), 1, H, bf16(w_->up), I, nullptr, u.data());
  for (int i = 0; i < I; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  cpu::linear_bf16(g.data(), 1, I, bf16(w_->down), H, nullptr, out);
  for (int j = 0; j < H; ++j) out[j] += resid[j];
}

int32_t Eagle3Drafter::draft_token(const float* prenorm, float* logits) const {
  const int H = c_.hidden, V = c_.draft_vocab;
  std::vector<float> hn(H);
  cpu::rmsnorm(prenorm, norm_.data(), 1, H, c_.rms_eps, hn.data());
  cpu::linear_bf16(hn.data(), 1, H, bf16(w_->lm_head), V, nullptr, logits);
  int best = 0;
  for (int i = 1; i < V; ++i)
    if (logits[i] > logits[best]) best = i;  // ties to the lower id
  return w_->draft_to_target[size_t(best)];
}

void Eagle3Drafter::commit(State& s, int32_t pos, int n, const int32_t* next_tokens, const float* taps) const {
  if (n <= 0) return;
  const int H = c_.hidden;
  if (s.last.empty() || pos < s.first_pos || pos > s.first_pos + s.rows) {
    s.reset();
    s.first_pos = pos;
  }
  s.rows = pos - s.first_pos;  // rewinds past rows recomputed now, drops scratch rows
  std::vector<float> h(size_t(n) * H);
  s.last.resize(H);
  cpu::linear_bf16(taps, n, tap_width(), bf16(w_->fc), H, nullptr, h.data());
  run_rows(s, pos, n, next_tokens, h.data(), s.last.data());
  s.rows += n;
}

std::vector<int32_t> Eagle3Drafter::propose(State& s, int k, std::vector<float>* logits) const {
  std::vector<int32_t> drafts;
  if (k <= 0 || s.last.empty()) return drafts;
  const int H = c_.hidden, KV = c_.num_kv_heads * c_.head_dim;
  s.k.resize(size_t(s.rows) * KV);  // scratch rows of an earlier proposal
  s.v.resize(size_t(s.rows) * KV);
  std::vector<float> h = s.last, out(H), lg(size_t(c_.draft_vocab));
  for (int j = 0; j < k; ++j) {
    if (j > 0) {
      run_rows(s, s.first_pos + s.rows + j - 1, 1, &drafts.back(), h.data(), out.data());
      h = out;
    }
    drafts.push_back(draft_token(h.data(), lg.data()));
    if (logits) logits->insert(logits->end(), lg.begin(), lg.end());
  }
  return drafts;
}

void HostEagle3Head::commit(Seq& s, int32_t pos, int n, const int32_t* next_tokens, const Eagle3Taps& taps) {
  if (!taps.host) throw Error("eagle3: the host head needs the target's taps in host memory");
  d_->commit(static_cast<HostSeq&>(s).state, pos, n, next_tokens, taps.host);
}

}  // namespace gptoss
