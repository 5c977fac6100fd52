#include "backend/backend.h"

#include <cmath>
#include <cstring>
#include <algorithm>
#include <functional>
#include <limits>

#include <string>
#include <vector>

#include "common/error.h"

namespace gptoss {

size_t kv_page_bytes(const GptOssConfig& c, KvGroup g, int page_size, DType dtype) {
  int layers = g == kKvSliding ? c.num_sliding_layers() : c.num_full_layers();
  return size_t(layers) * 2 * page_size * c.kv_dim() * dtype_size(dtype);
}

int32_t sample_row(const float* logits, int V, const RowSampling& s, std::vector<float>& p) {
  auto argmax = [&] {
    int best = 0;
    for (int i = 1; i < V; ++i)
      if (logits[i] > logits[best] || (std::isnan(logits[best]) && !std::isnan(logits[i]))) best = i;
    return int32_t(best);
  };
  if (s.temperature < 1e-5f) return argmax();
  float mx = -INFINITY;
  for (int i = 0; i < V; ++i)
    if (logits[i] > mx) mx = logits[i];
  if (!std::isfinite(mx)) return argmax();
  p.resize(V);
  const float inv_t = 1.0f / s.temperature;
  for (int i = 0; i < V; ++i) p[i] = std::isnan(logits[i]) ? 0.0f : std::exp((logits[i] - mx) * inv_t);
  float thr = std::max(s.min_p, std::numeric_limits<float>::denorm_min());  // p = 0 never kept
  if (s.top_k > 0 || s.top_p < 1.0f) {
    // The thresholds from the kept values in descending order.
    thread_local std::vector<float> sorted;
    sorted.clear();
    for (int i = 0; i < V; ++i)
      if (p[i] >= thr) sorted.push_back(p[i]);
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    if (s.top_k > 0 && int(sorted.size()) > s.top_k) {
      thr = sorted[s.top_k - 1];
      sorted.resize(std::upper_bound(sorted.begin(), sorted.end(), thr, std::greater<float>()) - sorted.begin());
    }
    if (s.top_p < 1.0f) {
      double kept = 0;
      for (float v : sorted) kept += v;
      const double limit = double(s.top_p) * kept;
      double cum = 0;
      for (float v : sorted) {
        cum += v;
        if (cum >= limit) {
          thr = v;
          break;
        }
      }
    }
  }
  // Sums in double: a float sum over 201088 small terms drifts by more than one token's mass.
  double kept = 0;
  for (int i = 0; i < V; ++i)
    if (p[i] >= thr) kept += p[i];
  const double target = double(s.u) * kept;
  double acc = 0;
  int32_t last = -1;
  for (int i = 0; i < V; ++i)
    if (p[i] >= thr) {
      acc += p[i];
      last = i;
      if (acc > target) return i;
    }
  return last >= 0 ? last : argmax();
}

int32_t sample_row_adjusted(float* logits, int V, const RowSampling& s, const LogitAdd* adds,
                            std::vector<float>& scratch) {
  if (s.adds_count <= 0) return sample_row(logits, V, s, scratch);
  thread_local std::vector<float> saved;
  saved.resize(size_t(s.adds_count));
  for (int k = 0; k < s.adds_count; ++k) {
    const int32_t t = adds[k].token;
    if (t < 0 || t >= V) throw Error("sample_row_adjusted: token " + std::to_string(t) + " outside the vocabulary");
    saved[size_t(k)] = logits[t];
    logits[t] = saved[size_t(k)] + adds[k].delta;
  }
  const int32_t tok = sample_row(logits, V, s, scratch);
  for (int k = 0; k < s.adds_count; ++k) logits[adds[k].token] = saved[size_t(k)];
  return tok;
}

double row_logsumexp(const float* logits, int vocab) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < vocab; ++i)
    if (!std::isnan(logits[i])) mx = std::max(mx, logits[i]);
  double s = 0;
  for (int i = 0; i < vocab; ++i)
    if (!std::isnan(logits[i])) s += std::exp(double(logits[i]) - mx);
  return double(mx) + std::log(s);
}

float clamp_logprob(double v) { return std::isnan(v) ? -9999.0f : float(std::max(v, -9999.0)); }

void row_top_logprobs(const float* logits, int vocab, int n, double lse, int32_t* ids, float* logprobs) {
  n = std::clamp(n, 0, vocab);
  thread_local std::vector<int32_t> idx;
  idx.resize(size_t(vocab));
  for (int i = 0; i < vocab; ++i) idx[size_t(i)] = i;
  auto val = [&](int i) { return std::isnan(logits[i]) ? -std::numeric_limits<float>::infinity() : logits[i]; };
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(),
                    [&](int a, int b) { return val(a) > val(b) || (val(a) == val(b) && a < b); });
  for (int k = 0; k < n; ++k) {
    ids[k] = idx[size_t(k)];
    logprobs[k] = clamp_logprob(double(logits[idx[size_t(k)]]) - lse);
  }
}

void Backend::forward_sample(const ForwardBatch& batch, const RowSampling* rows, int32_t* tokens_out,
                             float* logprobs_out, float* kept_logits, const LogitChanges& changes,
                             TopLogprobs* top_out) {
  const int V = config().vocab;
  std::vector<float> logits(batch.logit_rows.size() * size_t(V)), scratch;
  forward(batch, logits.data());
  size_t kept = 0;
  for (size_t r = 0; r < batch.logit_rows.size(); ++r) {
    float* row = logits.data() + r * V;
    if (rows[r].keep_logits) {
      if (!kept_logits) throw Error("forward_sample: a keep_logits row without kept_logits");
      std::copy_n(row, V, kept_logits + kept++ * size_t(V));
      tokens_out[r] = -1;
      if (logprobs_out) logprobs_out[r] = 0.0f;
      continue;
    }
    if ((rows[r].adds_count > 0 && !changes.adds) || (rows[r].allowed_row >= 0 && !changes.allowed))
      throw Error("forward_sample: a row with logit changes and no LogitChanges");
    if (rows[r].allowed_row >= 0)
      apply_mask(changes.allowed + size_t(rows[r].allowed_row) * allowed_words(V), allowed_words(V), row, V);
    tokens_out[r] = sample_row_adjusted(row, V, rows[r], changes.adds ? changes.adds + rows[r].adds_begin : nullptr, scratch);
    if (logprobs_out) {
      const double lse = row_logsumexp(row, V);
      logprobs_out[r] = clamp_logprob(double(row[tokens_out[r]]) - lse);
      if (top_out && rows[r].top_logprobs > 0)
        row_top_logprobs(row, V, std::min(rows[r].top_logprobs, kMaxTopLogprobs), lse, top_out[r].ids, top_out[r].logprobs);
    }
  }
}

void Backend::check_pipelined_batch(const ForwardBatch& b, bool tokens_from_last, int last_rows) {
  const size_t n = b.seqs.size();
  bool ok = n > 0 && b.tokens.size() == n && b.logit_rows.size() == n;
  for (size_t i = 0; ok && i < n; ++i)
    ok = b.seqs[i].first_token == int32_t(i) && b.seqs[i].n_tokens == 1 && b.logit_rows[i] == int32_t(i);
  if (!ok)
    throw Error("launch_greedy: a pipelined pass takes one token a sequence, in order, with every row's logits");
  if (tokens_from_last && int(n) != last_rows)
    throw Error("launch_greedy: tokens from the last pass need a launched pass of the same rows before it");
}

void Backend::launch_greedy(const ForwardBatch& batch, bool tokens_from_last) {
  check_pipelined_batch(batch, tokens_from_last, greedy_last_.empty() ? -1 : int(greedy_last_.size()));
  if (greedy_done_.size() >= 2) throw Error("launch_greedy: at most two passes in flight (finish_greedy the oldest)");
  const ForwardBatch* run = &batch;
  ForwardBatch fed;
  if (tokens_from_last) {
    fed = batch;
    fed.tokens = greedy_last_;
    run = &fed;
  }
  std::vector<int32_t> ids(batch.logit_rows.size());
  forward_greedy(*run, ids.data());
  greedy_last_ = ids;
  greedy_done_.push_back(std::move(ids));
}

void Backend::finish_greedy(int32_t* tokens_out) {
  if (greedy_done_.empty()) throw Error("finish_greedy: no pass launched");
  std::copy(greedy_done_.front().begin(), greedy_done_.front().end(), tokens_out);
  greedy_done_.erase(greedy_done_.begin());
}

void Backend::forward_greedy(const ForwardBatch& batch, int32_t* tokens_out) {
  const int V = config().vocab;
  std::vector<float> logits(batch.logit_rows.size() * size_t(V));
  forward(batch, logits.data());
  for (size_t r = 0; r < batch.logit_rows.size(); ++r) {
    const float* row = logits.data() + r * V;
    int best = 0;
    for (int i = 1; i < V; ++i)
      if (row[i] > row[best]) best = i;
    tokens_out[r] = best;
  }
}

}  // namespace gptoss
