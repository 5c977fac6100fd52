// The int8 screen of lm_head's bound (backend/cuda/kernels/linear/lm_head_screen_math.h), checked
// on the CPU: the kernels' arithmetic emulated in fp32 (bf16 x bf16 and int8 x fp16 products are
// exact in fp32; the sums run serially, the worst order the bound allows for), at gpt-oss's K.
// The GPU kernels themselves are tested against the full lm_head in test_cuda_linear.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cuda/kernels/linear/lm_head_screen_math.h"

namespace {

namespace sc = gptoss::cuda::screen;

constexpr int kK = 2880;  // gpt-oss's hidden size

float to_bf16(float f) {  // round to nearest even, as the checkpoint's and the kernels' bf16 are
  uint32_t b;
  std::memcpy(&b, &f, 4);
  b = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
  float r;
  std::memcpy(&r, &b, 4);
  return r;
}
float to_f16(float f) { return float(static_cast<_Float16>(f)); }  // RNE, subnormals included

struct Row {
  std::vector<float> w;  // bf16 values
  std::vector<int> q;
  sc::RowConst c;
};

Row quantized(std::vector<float> w) {
  Row r;
  float amax = 0.f;
  for (float v : w) amax = std::fmax(amax, std::fabs(v));
  const float scale = sc::row_scale(amax);
  double e2 = 0, w2 = 0, q2 = 0;
  for (float v : w) {
    const int q = sc::quantize(v, scale);
    r.q.push_back(q);
    const double d = double(v) - double(scale) * q;
    e2 += d * d;
    w2 += double(v) * v;
    q2 += double(q) * q;
  }
  r.c = sc::row_constants(scale, e2, w2, q2, int(w.size()));
  r.w = std::move(w);
  return r;
}

struct Step {
  std::vector<float> x, x16;
  sc::StepNorms n;
};

Step step_of(const std::vector<float>& x_bf16) {
  Step s{x_bf16, {}, {}};
  float x2 = 0.f, d2 = 0.f, h2 = 0.f;
  for (float v : x_bf16) {
    const float h = to_f16(v);
    s.x16.push_back(h);
    x2 += v * v;
    h2 += h * h;
    d2 += (v - h) * (v - h);
  }
  s.n = sc::inflate(x2, d2, h2);
  return s;
}

// The full kernel's logit and the screen's, each an fp32 accumulation of exact products.
float full_logit(const Row& r, const Step& s) {
  float acc = 0.f;
  for (size_t i = 0; i < r.w.size(); ++i) acc += r.w[i] * s.x[i];
  return acc;
}
float screen_logit(const Row& r, const Step& s) {
  float acc = 0.f;
  for (size_t i = 0; i < r.q.size(); ++i) acc += float(r.q[i]) * s.x16[i];
  return acc * r.c.scale;
}

std::vector<float> gaussian_bf16(std::mt19937& rng, int n, float sd) {
  std::normal_distribution<float> nd(0.f, sd);
  std::vector<float> v(n);
  for (float& f : v) f = to_bf16(nd(rng));
  return v;
}

TEST(LmHeadScreenMath, BoundHoldsAndItsWeightErrorTermIsReached) {
  std::mt19937 rng(7);
  int checked = 0;
  for (int i = 0; i < 64; ++i) {
    std::vector<float> w = gaussian_bf16(rng, kK, 0.02f);
    if (i % 8 == 1) w[i] = to_bf16(0.9f);    // an outlier: a coarse scale for the rest
    if (i % 8 == 2) w.assign(kK, 0.f);       // an all-zero row
    if (i % 8 == 3) for (float& v : w) v = to_bf16(v * 1e-4f);
    const Row r = quantized(w);
    // The activation that reaches Cauchy-Schwarz for the weights' error: x along w - s q.
    std::vector<float> xd(kK);
    double en = 0;
    for (int k = 0; k < kK; ++k) {
      const double d = double(r.w[k]) - double(r.c.scale) * r.q[k];
      xd[k] = float(d);
      en += d * d;
    }
    en = std::sqrt(en);
    for (float& v : xd) v = to_bf16(en > 0 ? float(v / en * 3.0) : 0.f);  // ||x|| ~ 3, fp16-exact mostly
    const std::vector<std::vector<float>> xs = {xd, gaussian_bf16(rng, kK, 1.f), gaussian_bf16(rng, kK, 40.f)};
    for (size_t j = 0; j < xs.size(); ++j) {
      const Step s = step_of(xs[j]);
      const float F = full_logit(r, s), S = screen_logit(r, s), rad = sc::radius(r.c, s.n, S);
      ASSERT_LE(std::fabs(F - S), rad) << "row " << i;
      ++checked;
      if (j == 0 && en > 0 && i % 8 != 1) {
        // The bound's main term is what this x gets: a radius without it would not hold.
        EXPECT_GT(std::fabs(F - S), 0.5f * r.c.c1 * s.n.x) << "row " << i;
      }
    }
  }
  EXPECT_EQ(checked, 64 * 3);
}

TEST(LmHeadScreenMath, BoundCoversActivationsFp16CannotHold) {
  // Activations below fp16's normal range lose bits on their way to the tensor cores: x_i = (k +
  // 1/2) 2^-24 rounds to k or k + 1 by k's parity, so x - x16 = +-2^-25 with the sign of q_i: the
  // term s q . (x - x16) at its Cauchy-Schwarz size, which the radius must hold (and does only
  // through its ||x - x16|| term).
  std::mt19937 rng(11);
  for (int i = 0; i < 16; ++i) {
    const Row r = quantized(gaussian_bf16(rng, kK, 0.02f));
    std::uniform_int_distribution<int> kd(0, 3);
    std::vector<float> x(kK);
    for (int k = 0; k < kK; ++k) {
      int m = 2 * kd(rng) + (r.q[k] < 0 ? 1 : 0);  // even rounds down (x > x16), odd up
      x[k] = to_bf16(std::ldexp(float(m) + 0.5f, -24));
    }
    const Step s = step_of(x);
    ASSERT_GT(s.n.d, 0.f);
    const float F = full_logit(r, s), S = screen_logit(r, s);
    ASSERT_LE(std::fabs(F - S), sc::radius(r.c, s.n, S)) << i;
    EXPECT_GT(std::fabs(F - S), r.c.c1 * s.n.x + r.c.c3 * s.n.x16) << i;  // beyond the other terms
  }
}

TEST(LmHeadScreenMath, NonFiniteRowsAndRowsOfZerosAreHandled) {
  std::vector<float> w(kK, 0.f);
  Row z = quantized(w);
  EXPECT_EQ(z.c.scale, 1.f);
  EXPECT_EQ(z.c.c1, 0.f);
  w[5] = std::numeric_limits<float>::infinity();
  Row inf = quantized(w);
  EXPECT_FALSE(std::isfinite(inf.c.c1));  // always a candidate (the kernel's row_bounds)
  w[5] = std::numeric_limits<float>::quiet_NaN();
  Row nan = quantized(w);
  EXPECT_FALSE(std::isfinite(nan.c.c1));
}

// The argmax keys pick what argmax_rows picks: the largest value, the lowest id among equals
// (-0 == +0), NaN ignored, 0 where every value is NaN.
int argmax_rows_rule(const std::vector<float>& v) {
  float best = -INFINITY;
  int bi = 0x7fffffff;
  for (int i = 0; i < int(v.size()); ++i)
    if (v[i] > best || (v[i] == best && i < bi)) {
      best = v[i];
      bi = i;
    }
  return bi == 0x7fffffff ? 0 : bi;
}

TEST(LmHeadScreenMath, ArgmaxKeysPickWhatArgmaxRowsPicks) {
  std::mt19937 rng(3);
  const float pool[] = {-INFINITY, INFINITY, std::numeric_limits<float>::quiet_NaN(), 0.f, -0.f, 1.f, -1.f,
                        1e-30f, -1e-30f, 3.5f, 3.5f, std::numeric_limits<float>::denorm_min(), -2.f};
  std::uniform_int_distribution<int> pick(0, int(std::size(pool)) - 1), len(1, 12);
  for (int trial = 0; trial < 20000; ++trial) {
    std::vector<float> v(len(rng));
    for (float& f : v) f = pool[pick(rng)];
    uint64_t best = 0;
    // In any order (the kernels' atomics): the max of the keys.
    std::vector<int> order(v.size());
    for (size_t i = 0; i < v.size(); ++i) order[i] = int(i);
    std::shuffle(order.begin(), order.end(), rng);
    for (int i : order) best = std::max(best, sc::argmax_key(v[i], i));
    ASSERT_EQ(sc::argmax_key_id(best), argmax_rows_rule(v)) << "trial " << trial;
  }
  // Order keys are monotonic over the floats.
  std::vector<float> f = {-INFINITY, -3e38f, -1.f, -1e-38f, -0.f, 0.f, 1e-45f, 1e-38f, 1.f, 3e38f, INFINITY};
  for (size_t i = 1; i < f.size(); ++i) EXPECT_GE(sc::order_key(f[i]), sc::order_key(f[i - 1])) << i;
  EXPECT_GT(sc::order_key(-INFINITY), 0u);  // 0 stays "none yet"
}

TEST(LmHeadScreenMath, ScreenKeepsTheArgmaxAndFewRows) {
  // lm_head-like rows (8192 of 201088) and RMS-normalized activations: the argmax of the full
  // logits is always among the candidates, and the candidates are a few in a thousand (the
  // kernels' cost: each candidate's 32-row tile pair read again in bf16).
  std::mt19937 rng(5);
  const int V = 8192;
  std::vector<Row> rows;
  for (int t = 0; t < V; ++t) rows.push_back(quantized(gaussian_bf16(rng, kK, 0.02f)));
  long long cands = 0;
  double r_sum = 0, sd_sum = 0;  // the radius against the logits' spread
  const int steps = 12;
  for (int it = 0; it < steps; ++it) {
    std::vector<float> x = gaussian_bf16(rng, kK, 1.f);
    if (it == 3) {  // a tie for the maximum: the best row copied to a lower id
      const Step s0 = step_of(x);
      int b = 0;
      float bv = -INFINITY;
      for (int t = 0; t < V; ++t) {
        const float F = full_logit(rows[t], s0);
        if (F > bv) {
          bv = F;
          b = t;
        }
      }
      rows[b / 2] = rows[b];
    }
    const Step s = step_of(x);
    std::vector<float> F(V), S(V), R(V);
    uint32_t lower = 0;
    double s1 = 0, s2 = 0;
    for (int t = 0; t < V; ++t) {
      F[t] = full_logit(rows[t], s);
      S[t] = screen_logit(rows[t], s);
      R[t] = sc::radius(rows[t].c, s.n, S[t]);
      lower = std::max(lower, sc::order_key(S[t] - R[t]));
      s1 += S[t];
      s2 += double(S[t]) * S[t];
      r_sum += R[t];
    }
    sd_sum += std::sqrt(s2 / V - (s1 / V) * (s1 / V)) * V;
    uint64_t best = 0;
    int n = 0;
    for (int t = 0; t < V; ++t)
      if (sc::order_key(S[t] + R[t]) >= lower) {
        ++n;
        best = std::max(best, sc::argmax_key(F[t], t));
      }
    ASSERT_EQ(sc::argmax_key_id(best), argmax_rows_rule(F)) << "step " << it;
    if (it == 3) {
      EXPECT_GE(n, 2);
    }
    cands += n;
  }
  const double frac = double(cands) / (double(steps) * V);
  // (With more rows the maximum stands further out: at 201088 rows and this radius, a Gaussian
  // spread of logits leaves a few dozen candidates.)
  std::printf("candidates: %.1f of %d rows a step (%.3f%%); radius %.3f sd of the screen's logits\n",
              double(cands) / steps, V, 100 * frac, r_sum / sd_sum);
  EXPECT_LT(frac, 0.01);
}

}  // namespace
