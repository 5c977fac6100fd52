#include "engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace gptoss {

RowSampling row_sampling(const SamplingParams& sp, double u) {
  RowSampling r;
  r.temperature = sp.temperature < 1e-5f ? 0.0f : sp.temperature;
  r.top_p = sp.top_p;
  r.min_p = sp.min_p;
  r.top_k = sp.top_k;
  r.u = float(u);
  return r;
}

int32_t sample_token(const float* logits, int vocab, const SamplingParams& sp,
                     const std::unordered_map<int32_t, int>& counts, std::mt19937_64& rng,
                     std::vector<float>& x, std::vector<int32_t>& idx) {
  const double u = uniform01(rng);
  x.assign(logits, logits + vocab);
  for (auto& v : x)
    if (std::isnan(v)) v = -std::numeric_limits<float>::infinity();
  for (auto [tok, bias] : sp.logit_bias)
    if (tok >= 0 && tok < vocab) x[tok] += bias;
  if (sp.presence_penalty != 0.0f || sp.frequency_penalty != 0.0f)
    for (auto [tok, c] : counts)
      if (tok >= 0 && tok < vocab && c > 0) x[tok] -= sp.frequency_penalty * c + sp.presence_penalty;
  thread_local std::vector<float> scratch;
  (void)idx;
  return sample_row(x.data(), vocab, row_sampling(sp, u), scratch);
}

TokenLogprob compute_logprobs(const float* logits, int vocab, int32_t chosen, int top_n) {
  const double lse = row_logsumexp(logits, vocab);
  auto lp = [&](int i) { return clamp_logprob(double(logits[i]) - lse); };
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
