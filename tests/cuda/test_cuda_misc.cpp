// The small kernels (kernels/misc) against the CPU reference: RMSNorm, the embedding gather, argmax
// and the sampler.

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/kernels.h"

#include "kernel_test_fixture.h"

namespace gptoss {
namespace {

using namespace gptoss::test;
using cuda::Epilogue;
using cuda::WeightMat;

TEST_F(Kernels, RmsNorm) {
  for (int n : {1, 33, 129}) {
    const int H = small_mode() ? 64 : 2880;
    FastRng r(fresh_seed());
    auto x = rand_f32(size_t(n) * H, r, 3.f);
    auto w = rand_f32(H, r, 0.1f, 1.f);
    std::vector<float> ref(x.size());
    cpu::rmsnorm(x.data(), w.data(), n, H, 1e-5f, ref.data());
    Dev<float> dx(x), dw(w);
    Dev<uint16_t> dy(x.size());
    cuda::rmsnorm(dx.p(), dw.p(), n, H, 1e-5f, nullptr, dy.p(), 0);
    double e = rel_err(from_bf16(dy.download()), ref);
    EXPECT_LE(e, 5e-3) << "n=" << n;
  }
}

TEST_F(Kernels, Embed) {
  const int V = 1000, H = 2880, n = 33;
  FastRng r(fresh_seed());
  auto table = to_bf16(rand_f32(size_t(V) * H, r));
  std::vector<int32_t> toks(n);
  for (auto& t : toks) t = int(r.next() % V);
  Dev<uint16_t> dt(table);
  Dev<int32_t> dk(toks);
  Dev<float> dx(size_t(n) * H);
  cuda::embed(dt.p(), dk.p(), n, H, dx.p(), 0);
  auto x = dx.download();
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < H; j += 97) ASSERT_EQ(x[size_t(i) * H + j], bf16_to_f32(table[size_t(toks[i]) * H + j]));
}

TEST_F(Kernels, Argmax) {
  // Unaligned rows and a V that is no multiple of 4 take the kernel's scalar paths; a tie checks
  // that the lowest index wins.
  for (int V : {small_mode() ? 1000 : 201088, 1001, 7}) {
    FastRng r(fresh_seed());
    const int n = 3;
    auto l = rand_f32(size_t(n) * V, r);
    if (V > 100) l[size_t(V) + 90] = l[size_t(V) + 95] = 10.f;
    Dev<float> dl(l);
    Dev<int32_t> out(n);
    cuda::argmax_rows(dl.p(), n, V, out.p(), 0);
    auto got = out.download();
    for (int i = 0; i < n; ++i)
      EXPECT_EQ(got[i], int(std::max_element(l.begin() + size_t(i) * V, l.begin() + size_t(i + 1) * V) -
                            (l.begin() + size_t(i) * V)))
          << "V=" << V << " row " << i;
  }
}

// Device sampling against the host rule (sample_row) on fresh logits: greedy exactly; sampled
// draws equal but for float rounding at a boundary (a few in a thousand at most); the drawn
// tokens' logprobs within float rounding of the host's log-softmax.
TEST_F(Kernels, SampleRowsMatchHostRule) {
  FastRng r(fresh_seed());
  const int V = small_mode() ? 1000 : 201088;
  std::vector<RowSampling> kinds(6);
  kinds[0].temperature = 0.0f;
  kinds[1].temperature = 1.0f;
  kinds[2].temperature = 0.7f, kinds[2].top_p = 0.9f;
  kinds[3].temperature = 1.0f, kinds[3].top_k = 40;
  kinds[4].temperature = 0.8f, kinds[4].min_p = 0.05f, kinds[4].top_p = 0.95f;
  kinds[5].temperature = 1.3f, kinds[5].top_k = 1000, kinds[5].top_p = 0.5f;
  const int per_kind = 16, n = int(kinds.size()) * per_kind;
  // Peaked rows (sd 3), as real logits are, so top-p keeps a few hundred tokens.
  auto l = rand_f32(size_t(n) * V, r, 3.0f);
  std::vector<RowSampling> how(n);
  for (int i = 0; i < n; ++i) {
    how[i] = kinds[i / per_kind];
    how[i].u = float((r.next() >> 11) * 0x1.0p-53);
  }
  Dev<float> dl(l);
  Dev<RowSampling> dh(how);
  Dev<int32_t> out(n);
  Dev<float> lp(n);
  cuda::sample_rows(dl.p(), n, V, dh.p(), out.p(), 0, lp.p());
  auto got = out.download();
  const auto got_lp = lp.download();
  std::vector<float> scratch;
  int differ = 0;
  for (int i = 0; i < n; ++i) {
    const float* row = l.data() + size_t(i) * V;
    int32_t want = sample_row(row, V, how[i], scratch);
    ASSERT_GE(got[i], 0);
    ASSERT_LT(got[i], V);
    // The drawn token's logprob (whichever token the device drew) against the host's log-softmax.
    const double want_lp = double(row[got[i]]) - row_logsumexp(row, V);
    EXPECT_NEAR(got_lp[i], want_lp, 1e-4 + 1e-5 * std::fabs(want_lp)) << "row " << i;
    if (how[i].temperature == 0.0f) EXPECT_EQ(got[i], want) << "greedy row " << i;
    else differ += got[i] != want;
  }
  std::printf("sampled rows differing from the host rule: %d of %d\n", differ, n - per_kind);
  EXPECT_LE(differ, 2);
}

// Logit changes (logit_bias, penalties) and structured-output masks applied by the sampler: rows
// with 0, 1, a few and thousands of changed ids (the first and last id among them, the row's
// best pushed down, a NaN logit changed), every third row masked (half the ids allowed at
// random, or only a handful), against the host's apply_mask + sample_row_adjusted on the same
// rows; the logprob the masked row's before its changes; add_raw those logits; rows without
// changes as before. Most rows ask for a top list (1 to 20 tokens: the masked rows' lists run
// into ties at -inf, which go to the lower ids), against row_top_logprobs: the same ids.
TEST_F(Kernels, SampleRowsApplyLogitAdds) {
  FastRng r(fresh_seed());
  const int V = small_mode() ? 3000 : 201088;
  const int n = 24;
  auto l = rand_f32(size_t(n) * V, r, 3.0f);
  l[size_t(5) * V + 17] = NAN;  // row 5: a NaN logit with a change
  std::vector<RowSampling> how(n);
  std::vector<LogitAdd> adds;
  const size_t words = allowed_words(V);
  std::vector<uint64_t> allowed;
  for (int i = 0; i < n; ++i) {
    if (i % 3 == 2) {
      how[i].allowed_row = int32_t(allowed.size() / words);
      allowed.resize(allowed.size() + words, 0);
      uint64_t* w = allowed.data() + allowed.size() - words;
      if (i % 2) {
        for (size_t k = 0; k < words; ++k) w[k] = r.next();
      } else {
        for (int k = 0; k < 5; ++k) {
          const uint64_t id = r.next() % uint64_t(V);
          w[id / 64] |= uint64_t(1) << (id % 64);
        }
      }
      if (V % 64) w[words - 1] &= (uint64_t(1) << (V % 64)) - 1;
    }
    how[i].temperature = i % 4 == 0 ? 0.0f : 0.6f + 0.1f * float(i % 5);
    how[i].top_p = i % 3 == 0 ? 0.9f : 1.0f;
    how[i].top_k = i % 5 == 1 ? 50 : 0;
    how[i].u = float((r.next() >> 11) * 0x1.0p-53);
    how[i].top_logprobs = i % 7 == 3 ? 0 : i % 4 == 0 ? kMaxTopLogprobs : 1 + i % 9;
    const int count = i % 6 == 0 ? 0 : i % 6 == 1 ? 1 : i % 6 == 5 ? 3000 : 1 + i % 7;
    const float* row = l.data() + size_t(i) * V;
    const int32_t top = int32_t(std::max_element(row, row + V) - row);
    std::vector<int32_t> ids = {top, 0, V - 1, 17};
    while (int(ids.size()) < count) ids.push_back(int32_t(r.next() % uint64_t(V)));
    ids.resize(size_t(count));
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    how[i].adds_begin = int32_t(adds.size());
    how[i].adds_count = int32_t(ids.size());
    for (int32_t t : ids) adds.push_back({t, t == top ? -40.0f : float(int(r.next() % 2001) - 1000) * 0.01f});
  }
  Dev<float> dl(l);
  Dev<RowSampling> dh(how);
  Dev<LogitAdd> da(adds);
  Dev<float> draw(adds.size());
  Dev<uint64_t> dallowed(allowed);
  Dev<int32_t> out(n);
  Dev<float> lp(n);
  Dev<TopLogprobs> dtop(n);
  cuda::sample_rows(dl.p(), n, V, dh.p(), out.p(), 0, lp.p(), da.p(), draw.p(), dallowed.p(), dtop.p());
  const auto got = out.download();
  const auto tops = dtop.download();
  const auto got_lp = lp.download();
  const auto raw = draw.download();
  std::vector<float> scratch, row;
  int differ = 0;
  for (int i = 0; i < n; ++i) {
    row.assign(l.begin() + size_t(i) * V, l.begin() + size_t(i + 1) * V);
    if (how[i].allowed_row >= 0) apply_mask(allowed.data() + size_t(how[i].allowed_row) * words, words, row.data(), V);
    for (int k = 0; k < how[i].adds_count; ++k) {
      const float want_raw = row[adds[size_t(how[i].adds_begin + k)].token];
      if (std::isnan(want_raw)) EXPECT_TRUE(std::isnan(raw[size_t(how[i].adds_begin + k)])) << "row " << i;
      else EXPECT_EQ(raw[size_t(how[i].adds_begin + k)], want_raw) << "row " << i << " entry " << k;
    }
    const int32_t want = sample_row_adjusted(row.data(), V, how[i], adds.data() + how[i].adds_begin, scratch);
    ASSERT_GE(got[i], 0);
    ASSERT_LT(got[i], V);
    if (how[i].allowed_row >= 0) {
      EXPECT_TRUE((allowed[size_t(how[i].allowed_row) * words + size_t(got[i]) / 64] >> (got[i] % 64)) & 1)
          << "row " << i << " drew a refused token";
    }
    const double lse = row_logsumexp(row.data(), V);
    const double want_lp = double(row[got[i]]) - lse;
    EXPECT_NEAR(got_lp[i], want_lp, 1e-4 + 1e-5 * std::fabs(want_lp)) << "row " << i;
    if (how[i].top_logprobs > 0) {  // the masked row's list (sample_row_adjusted gave the row back)
      const int k = how[i].top_logprobs;
      int32_t ids[kMaxTopLogprobs];
      float lps[kMaxTopLogprobs];
      row_top_logprobs(row.data(), V, k, lse, ids, lps);
      for (int j = 0; j < k; ++j) {
        EXPECT_EQ(tops[size_t(i)].ids[j], ids[j]) << "row " << i << " top " << j;
        EXPECT_NEAR(tops[size_t(i)].logprobs[j], lps[j], 1e-4 + 1e-5 * std::fabs(lps[j])) << "row " << i << " top " << j;
      }
    }
    if (how[i].temperature == 0.0f) EXPECT_EQ(got[i], want) << "greedy row " << i;
    else differ += got[i] != want;
  }
  std::printf("sampled rows with logit changes differing from the host rule: %d of %d\n", differ, n - n / 4);
  EXPECT_LE(differ, 1);
}

}  // namespace
}  // namespace gptoss
