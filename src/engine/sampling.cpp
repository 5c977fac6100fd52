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

void logit_adds(const SamplingParams& sp, const std::unordered_map<int32_t, int>& counts, int vocab,
                std::vector<LogitAdd>& out) {
  const size_t first = out.size();
  for (auto [tok, bias] : sp.logit_bias)
    if (tok >= 0 && tok < vocab) out.push_back({tok, bias});
  if (sp.presence_penalty != 0.0f || sp.frequency_penalty != 0.0f)
    for (auto [tok, c] : counts)
      if (c > 0 && tok >= 0 && tok < vocab) out.push_back({tok, -(sp.frequency_penalty * float(c) + sp.presence_penalty)});
  // In id order, one entry a token: the bias first, then the penalty (the order they are summed in).
  std::stable_sort(out.begin() + std::ptrdiff_t(first), out.end(),
                   [](const LogitAdd& a, const LogitAdd& b) { return a.token < b.token; });
  size_t w = first;
  for (size_t i = first; i < out.size(); ++i) {
    if (w > first && out[w - 1].token == out[i].token) out[w - 1].delta += out[i].delta;
    else out[w++] = out[i];
  }
  out.resize(w);
  out.erase(std::remove_if(out.begin() + std::ptrdiff_t(first), out.end(), [](const LogitAdd& a) { return a.delta == 0.0f; }),
            out.end());
}

int32_t sample_token(float* logits, int vocab, const SamplingParams& sp, const std::unordered_map<int32_t, int>& counts,
                     std::mt19937_64& rng) {
  const double u = uniform01(rng);
  // logit_bias and penalties change the few tokens they name, in place, and are taken back after
  // the draw (sample_row_adjusted): no copy of the 201,088-float row (on a slow host a copy and a
  // scan cost a penalized row more than its draw). NaNs stay: sample_row never draws one while a
  // number is left. The same entries a backend applies when it draws the row itself.
  thread_local std::vector<LogitAdd> adds;
  adds.clear();
  if (changes_logits(sp)) logit_adds(sp, counts, vocab, adds);
  RowSampling how = row_sampling(sp, u);
  how.adds_count = int32_t(adds.size());
  thread_local std::vector<float> scratch;
  return sample_row_adjusted(logits, vocab, how, adds.data(), scratch);
}

TokenLogprob compute_logprobs(const float* logits, int vocab, int32_t chosen, int top_n) {
  const double lse = row_logsumexp(logits, vocab);
  auto lp = [&](int i) { return clamp_logprob(double(logits[i]) - lse); };
  TokenLogprob out;
  out.token = chosen;
  out.logprob = lp(chosen);
  if (top_n > 0) {  // the rule every backend's top list follows
    top_n = std::min(top_n, vocab);
    std::vector<int32_t> ids(static_cast<size_t>(top_n));
    std::vector<float> lps(static_cast<size_t>(top_n));
    row_top_logprobs(logits, vocab, top_n, lse, ids.data(), lps.data());
    for (int k = 0; k < top_n; ++k) out.top.emplace_back(ids[size_t(k)], lps[size_t(k)]);
  }
  return out;
}

}  // namespace gptoss
