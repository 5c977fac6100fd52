#include "engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace gptoss {

static int32_t argmax(const float* x, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

int32_t sample_token(const float* logits, int vocab, const SamplingParams& sp,
                     const std::unordered_map<int32_t, int>& counts, std::mt19937_64& rng,
                     std::vector<float>& x, std::vector<int32_t>& idx) {
  const double u = uniform01(rng);
  x.assign(logits, logits + vocab);
  for (auto& v : x)
    if (std::isnan(v)) v = -std::numeric_limits<float>::infinity();
  if (sp.presence_penalty != 0.0f || sp.frequency_penalty != 0.0f)
    for (auto [tok, c] : counts)
      if (tok >= 0 && tok < vocab && c > 0) x[tok] -= sp.frequency_penalty * c + sp.presence_penalty;
  if (sp.temperature < 1e-5f) return argmax(x.data(), vocab);

  const float inv_t = 1.0f / sp.temperature;
  float mx = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < vocab; ++i) mx = std::max(mx, x[i]);
  if (!std::isfinite(mx)) return argmax(x.data(), vocab);
  // probabilities (unnormalized) exp((x - max) / T)
  double total = 0;
  for (int i = 0; i < vocab; ++i) {
    float p = std::exp((x[i] - mx) * inv_t);
    x[i] = p;
    total += p;
  }
  // candidates: min_p keeps p >= min_p * p_max (p_max = 1 here before normalization)
  const float min_keep = sp.min_p > 0.0f ? sp.min_p : 0.0f;
  idx.clear();
  for (int i = 0; i < vocab; ++i)
    if (x[i] > 0.0f && x[i] >= min_keep) idx.push_back(i);
  if (idx.empty()) return argmax(logits, vocab);
  const bool need_sort = (sp.top_k > 0 && sp.top_k < int(idx.size())) || sp.top_p < 1.0f;
  if (need_sort) {
    auto cmp = [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
    if (sp.top_k > 0 && sp.top_k < int(idx.size())) {
      std::partial_sort(idx.begin(), idx.begin() + sp.top_k, idx.end(), cmp);
      idx.resize(sp.top_k);
    } else {
      std::sort(idx.begin(), idx.end(), cmp);
    }
  }
  double kept = 0;
  for (int32_t i : idx) kept += x[i];
  if (sp.top_p < 1.0f) {
    double cum = 0;
    size_t n = 0;
    const double limit = double(sp.top_p) * kept;
    while (n < idx.size()) {
      cum += x[idx[n]];
      ++n;
      if (cum >= limit) break;
    }
    idx.resize(std::max<size_t>(n, 1));
    kept = cum;
  }
  (void)total;
  double target = u * kept, acc = 0;
  for (int32_t i : idx) {
    acc += x[i];
    if (acc > target) return i;
  }
  return idx.back();
}

TokenLogprob compute_logprobs(const float* logits, int vocab, int32_t chosen, int top_n) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < vocab; ++i)
    if (!std::isnan(logits[i])) mx = std::max(mx, logits[i]);
  double s = 0;
  for (int i = 0; i < vocab; ++i)
    if (!std::isnan(logits[i])) s += std::exp(double(logits[i]) - mx);
  const double lse = double(mx) + std::log(s);
  auto lp = [&](int i) {
    float v = std::isnan(logits[i]) ? -std::numeric_limits<float>::infinity() : float(logits[i] - lse);
    return std::max(v, -9999.0f);  // JSON has no -inf
  };
  TokenLogprob out;
  out.token = chosen;
  out.logprob = lp(chosen);
  if (top_n > 0) {
    top_n = std::min(top_n, vocab);
    std::vector<int32_t> idx(vocab);
    for (int i = 0; i < vocab; ++i) idx[i] = i;
    auto val = [&](int i) { return std::isnan(logits[i]) ? -std::numeric_limits<float>::infinity() : logits[i]; };
    std::partial_sort(idx.begin(), idx.begin() + top_n, idx.end(),
                      [&](int a, int b) { return val(a) > val(b) || (val(a) == val(b) && a < b); });
    for (int k = 0; k < top_n; ++k) out.top.emplace_back(idx[k], lp(idx[k]));
  }
  return out;
}

}  // namespace gptoss
