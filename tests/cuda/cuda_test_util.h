#pragma once
// Helpers of the CUDA tests: device buffers with poison, bf16 rounding, fast random data.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_common.h"
#include "common/dtype.h"

namespace gptoss::test {

// Skips the test when the machine has no usable GPU (CI compiles these tests but has none).
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  }
};

// tests/data/tiny-gptoss; GPTOSS_TEST_DATA_DIR overrides the build-time data path (prebuilt tests
// run on another machine).
inline std::string tiny_fixture_dir() {
  const char* d = std::getenv("GPTOSS_TEST_DATA_DIR");
  return std::string(d ? d : GPTOSS_TEST_DATA) + "/tiny-gptoss";
}

// GPTOSS_TEST_SMALL=1 keeps only small shapes (compute-sanitizer runs).
inline bool small_mode() { return std::getenv("GPTOSS_TEST_SMALL") != nullptr; }

inline uint64_t fresh_seed() {
  static uint64_t s = std::random_device{}() * 0x9e3779b97f4a7c15ull + 1;
  s = s * 6364136223846793005ull + 1442695040888963407ull;
  return s;
}

struct FastRng {
  uint64_t s;
  explicit FastRng(uint64_t seed) : s(seed ? seed : 1) {}
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  float uniform() { return float(next() >> 40) * (1.0f / 16777216.0f); }  // [0, 1)
  float normalish() { return (uniform() + uniform() + uniform() - 1.5f) * 2.0f; }  // sd 1
};

// cnt random bytes in [lo, hi]: full-range bytes eight to a draw, narrower ranges by a
// multiply-shift. (Drawn one at a time through a 64-bit modulo, the 1.6 GB of MXFP4 weights a
// 128-expert MoE case needs took most of the MoE tests' ~4 minutes on the GPU machine's host.)
inline std::vector<uint8_t> rand_bytes(FastRng& r, size_t cnt, int lo = 0, int hi = 255) {
  std::vector<uint8_t> v(cnt);
  if (lo == 0 && hi == 255) {
    size_t i = 0;
    for (; i + 8 <= cnt; i += 8) {
      const uint64_t x = r.next();
      std::memcpy(&v[i], &x, 8);
    }
    if (i < cnt) {
      const uint64_t x = r.next();
      std::memcpy(&v[i], &x, cnt - i);
    }
  } else {
    const uint64_t span = uint64_t(hi - lo + 1);
    for (auto& b : v) b = uint8_t(lo + int(((r.next() >> 32) * span) >> 32));
  }
  return v;
}

inline std::vector<float> rand_f32(size_t n, FastRng& r, float sd = 1.f, float mean = 0.f) {
  std::vector<float> v(n);
  for (auto& x : v) x = mean + sd * r.normalish();
  return v;
}
inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = f32_to_bf16(v[i]);
  return o;
}
inline std::vector<float> from_bf16(const std::vector<uint16_t>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = bf16_to_f32(v[i]);
  return o;
}
inline std::vector<float> round_bf16(std::vector<float> v) {
  for (auto& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

template <class T>
struct Dev {
  cuda::DeviceBuffer b;
  size_t n = 0;
  Dev() = default;
  explicit Dev(size_t count) : b(count * sizeof(T)), n(count) { poison(); }
  explicit Dev(const std::vector<T>& h) : b(h.size() * sizeof(T)), n(h.size()) { upload(h); }
  T* p() const { return b.get<T>(); }
  void upload(const std::vector<T>& h) {
    GPTOSS_CUDA_CHECK(cudaMemcpy(p(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  // 0xff bytes: NaN as f32 and bf16, so any element a kernel forgets to write shows up.
  void poison() { GPTOSS_CUDA_CHECK(cudaMemset(p(), 0xff, n * sizeof(T))); }
  std::vector<T> download() const {
    GPTOSS_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> h(n);
    GPTOSS_CUDA_CHECK(cudaMemcpy(h.data(), p(), n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

inline double rel_err(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(ref[i])) return INFINITY;  // a NaN anywhere fails
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// One mixed prefill pass over several sequences, in order: sequence s brings lens[s] random
// tokens below V (appended to toks[s]) from position 0, its pages (both KV groups) pages[s], and
// asks for its last token's logits. The batch points into `pages`, which must outlive it.
inline ForwardBatch mixed_prefill_batch(const std::vector<std::vector<int32_t>>& pages, const std::vector<int>& lens,
                                        int V, FastRng& r, std::vector<std::vector<int32_t>>& toks) {
  ForwardBatch fb;
  for (size_t s = 0; s < lens.size(); ++s) {
    SeqBatchInfo si;
    si.first_token = int(fb.tokens.size());
    si.n_tokens = lens[s];
    si.start_pos = 0;
    for (int g = 0; g < 2; ++g) { si.pages[g] = pages[s].data(); si.n_pages[g] = int(pages[s].size()); }
    for (int i = 0; i < lens[s]; ++i) { toks[s].push_back(int(r.next() % uint64_t(V))); fb.tokens.push_back(toks[s].back()); }
    fb.seqs.push_back(si);
    fb.logit_rows.push_back(si.first_token + lens[s] - 1);
  }
  return fb;
}

// forward_sample of batch b, greedy, with the rows `keep` marks kept for the host (the engine's
// mixed sampling): a kept row is not drawn (-1) and holds the logits forward() gave (`logits`,
// [rows, V] in logit-row order); every other row is its greedy id.
inline void expect_kept_rows(Backend& be, const ForwardBatch& b, const std::vector<bool>& keep,
                             const std::vector<float>& logits, const std::vector<int32_t>& greedy, int V) {
  const size_t n = b.logit_rows.size();
  std::vector<RowSampling> how(n);
  size_t n_kept = 0;
  for (size_t i = 0; i < n; ++i) {
    how[i].temperature = 0.0f;
    how[i].keep_logits = keep[i];
    n_kept += keep[i];
  }
  std::vector<int32_t> ids(n);
  std::vector<float> kept(n_kept * size_t(V));
  be.forward_sample(b, how.data(), ids.data(), nullptr, kept.data());
  for (size_t i = 0, k = 0; i < n; ++i) {
    if (!keep[i]) {
      EXPECT_EQ(ids[i], greedy[i]) << "drawn row " << i;
      continue;
    }
    EXPECT_EQ(ids[i], -1) << "kept row " << i;
    std::vector<float> got(kept.begin() + k * V, kept.begin() + (k + 1) * V);
    std::vector<float> want(logits.begin() + i * V, logits.begin() + (i + 1) * V);
    EXPECT_LE(rel_err(got, want), 1e-6) << "kept row " << i;
    ++k;
  }
}

// forward_sample of batch b with logit changes on every other row (the engine's logit_bias and
// penalties, drawn on the device): each such row pushes its raw argmax down by 30 and lifts two
// other ids, so its greedy id moves; rows 1, 4, 7, ... are masked to every third id (a
// structured-output mask). Rows are drawn at `temperature` with spread uniforms. Every row's id
// against the host rule on forward()'s logits (`logits`, [rows, V] in logit-row order) with the
// same mask and changes (apply_mask, sample_row_adjusted): greedy exactly, sampled but for float
// rounding at a boundary (at most one row); each drawn token's logprob against the masked row's
// log-softmax before the changes, and rows 0, 3, 6, ... also their top 5 (row_top_logprobs).
inline void expect_adjusted_rows(Backend& be, const ForwardBatch& b, const std::vector<float>& logits, int V,
                                 float temperature) {
  const size_t n = b.logit_rows.size();
  std::vector<RowSampling> how(n);
  std::vector<LogitAdd> adds;
  std::vector<float> row;
  const size_t words = allowed_words(V);
  std::vector<uint64_t> allowed;
  for (size_t i = 0; i < n; ++i) {
    how[i].temperature = temperature;
    how[i].top_p = temperature > 0.0f ? 0.9f : 1.0f;
    how[i].u = float((i * 37 + 11) % 100) / 100.0f;
    if (i % 3 == 0) how[i].top_logprobs = 5;
    if (i % 3 == 1) {
      how[i].allowed_row = int32_t(allowed.size() / words);
      allowed.resize(allowed.size() + words, 0);
      for (int t = 0; t < V; t += 3) allowed[allowed.size() - words + size_t(t) / 64] |= uint64_t(1) << (t % 64);
    }
    if (i % 2 == 1) continue;
    const float* r = logits.data() + i * size_t(V);
    const int32_t top = int32_t(std::max_element(r, r + V) - r);
    std::vector<LogitAdd> mine = {{top, -30.0f}, {int32_t((top + 7) % V), 2.5f}, {int32_t((top * 13 + 5) % V), 1.0f}};
    std::sort(mine.begin(), mine.end(), [](const LogitAdd& x, const LogitAdd& y) { return x.token < y.token; });
    mine.erase(std::unique(mine.begin(), mine.end(), [](const LogitAdd& x, const LogitAdd& y) { return x.token == y.token; }),
               mine.end());
    how[i].adds_begin = int32_t(adds.size());
    how[i].adds_count = int32_t(mine.size());
    adds.insert(adds.end(), mine.begin(), mine.end());
  }
  std::vector<int32_t> ids(n);
  std::vector<float> lps(n, 1.0f), scratch;
  std::vector<TopLogprobs> tops(n);
  be.forward_sample(b, how.data(), ids.data(), lps.data(), nullptr, LogitChanges{adds.data(), allowed.data()},
                    tops.data());
  int differ = 0;
  for (size_t i = 0; i < n; ++i) {
    row.assign(logits.begin() + i * size_t(V), logits.begin() + (i + 1) * size_t(V));
    if (how[i].allowed_row >= 0) {
      apply_mask(allowed.data() + size_t(how[i].allowed_row) * words, words, row.data(), V);
      EXPECT_EQ(ids[i] % 3, 0) << "masked row " << i << " drew a refused token";
    }
    const int32_t want = sample_row_adjusted(row.data(), V, how[i], adds.data() + how[i].adds_begin, scratch);
    ASSERT_GE(ids[i], 0) << "row " << i;
    ASSERT_LT(ids[i], V) << "row " << i;
    if (temperature == 0.0f) EXPECT_EQ(ids[i], want) << "greedy row " << i << (how[i].adds_count ? " (adjusted)" : "");
    else differ += ids[i] != want;
    const double lse = row_logsumexp(row.data(), V);
    const double want_lp = double(row[ids[i]]) - lse;  // masked, before the changes
    EXPECT_NEAR(lps[i], want_lp, 1e-4 + 1e-5 * std::fabs(want_lp)) << "row " << i;
    if (how[i].top_logprobs > 0) {
      int32_t top_ids[kMaxTopLogprobs];
      float top_lps[kMaxTopLogprobs];
      row_top_logprobs(row.data(), V, how[i].top_logprobs, lse, top_ids, top_lps);
      for (int j = 0; j < how[i].top_logprobs; ++j) {
        EXPECT_EQ(tops[i].ids[j], top_ids[j]) << "row " << i << " top " << j;
        EXPECT_NEAR(tops[i].logprobs[j], top_lps[j], 1e-4 + 1e-5 * std::fabs(top_lps[j])) << "row " << i;
      }
    }
  }
  EXPECT_LE(differ, 1) << "sampled rows differing from the host rule at T=" << temperature;
}

}  // namespace gptoss::test
