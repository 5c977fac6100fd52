// Each CPU op against a naive double-precision loop written from the math in DESIGN.md.
#include "backend/cpu/cpu_ops.h"
#include "common/dtype.h"
#include "common/error.h"
#include "test_util.h"

namespace gptoss {
namespace {

TEST(CpuOps, LinearBf16MatchesNaive) {
  std::mt19937 rng(1);
  for (auto [n, in, out] : {std::tuple{1, 64, 3}, {5, 96, 17}, {33, 2880, 40}}) {
    auto x = test::random_floats(size_t(n) * in, rng);
    auto wf = test::random_floats(size_t(out) * in, rng, 0.05f);
    auto bias = test::random_floats(out, rng);
    std::vector<uint16_t> w(wf.size());
    for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(wf[i]);
    std::vector<float> y(size_t(n) * out), ref(y.size());
    cpu::linear_bf16(x.data(), n, in, w.data(), out, bias.data(), y.data());
    for (int t = 0; t < n; ++t)
      for (int o = 0; o < out; ++o) {
        double s = bias[o];
        for (int i = 0; i < in; ++i) s += double(x[t * in + i]) * bf16_to_f32(w[size_t(o) * in + i]);
        ref[t * out + o] = float(s);
      }
    // float32 dot products against double: measured up to 3.0e-7 at K = 2880 (rounding grows
    // ~sqrt(K)); 1e-6 leaves 3x, a wrong weight or bias is off by >1e-2.
    EXPECT_LE(test::rel_error(y.data(), ref.data(), y.size()), 1e-6) << n << "x" << in << "x" << out;
  }
}

TEST(CpuOps, LinearMxfp4MatchesNaive) {
  std::mt19937 rng(2);
  const int n = 7, in = 2880, out = 9;
  std::vector<uint8_t> blocks(size_t(out) * in / 2), scales(size_t(out) * in / 32);
  for (auto& b : blocks) b = uint8_t(rng());
  for (auto& s : scales) s = uint8_t(115 + rng() % 10);
  auto x = test::random_floats(size_t(n) * in, rng);
  std::vector<float> y(size_t(n) * out), ref(y.size());
  cpu::linear_mxfp4(x.data(), n, in, blocks.data(), scales.data(), out, nullptr, y.data());
  for (int t = 0; t < n; ++t)
    for (int o = 0; o < out; ++o) {
      double s = 0;
      for (int i = 0; i < in; ++i) {
        uint8_t byte = blocks[(size_t(o) * in + i) / 2];
        int code = i % 2 == 0 ? byte & 15 : byte >> 4;  // low nibble = even element
        double val = kE2M1Values[code] * std::ldexp(1.0, scales[(size_t(o) * in + i) / 32] - 127);
        s += x[t * in + i] * val;
      }
      ref[t * out + o] = float(s);
    }
  // MXFP4 codes decode exactly; what remains is float32 summation: measured 4.1e-7.
  EXPECT_LE(test::rel_error(y.data(), ref.data(), y.size()), 1e-6);
}

TEST(CpuOps, RmsNorm) {
  std::mt19937 rng(3);
  const int n = 3, H = 2880;
  auto x = test::random_floats(n * H, rng, 3.0f);
  auto w = test::random_floats(H, rng);
  std::vector<float> y(n * H), ref(n * H);
  cpu::rmsnorm(x.data(), w.data(), n, H, 1e-5f, y.data());
  for (int t = 0; t < n; ++t) {
    double ss = 0;
    for (int i = 0; i < H; ++i) ss += double(x[t * H + i]) * x[t * H + i];
    double r = 1 / std::sqrt(ss / H + 1e-5);
    for (int i = 0; i < H; ++i) ref[t * H + i] = float(x[t * H + i] * r * w[i]);
  }
  // The sum of squares is in double; one float rsqrt and two products remain: measured 7.2e-8
  // (about one ulp), so 3e-7 (4x). A wrong eps placement or mean is off by >1e-4.
  EXPECT_LE(test::rel_error(y.data(), ref.data(), y.size()), 3e-7);
}

TEST(CpuOps, RopeRotatesHalvesAndKeepsScaledNorm) {
  auto c = GptOssConfig::preset("120b");
  auto yarn = compute_yarn(c);
  ASSERT_EQ(int(yarn.inv_freq.size()), 32);
  EXPECT_NEAR(yarn.attention_scaling, 0.1 * std::log(32.0) + 1.0, 1e-6);
  EXPECT_FLOAT_EQ(yarn.inv_freq[0], 1.0f);  // highest frequency: pure extrapolation
  EXPECT_NEAR(yarn.inv_freq[31], 1.0 / (32.0 * std::pow(150000.0, 62.0 / 64)), 1e-12);  // interpolated
  std::mt19937 rng(4);
  const int n = 2, heads = 3, D = 64;
  auto x = test::random_floats(n * heads * D, rng);
  auto y = x;
  int32_t pos[2] = {0, 1000};
  cpu::rope(y.data(), n, heads, D, pos, yarn);
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < heads; ++h)
      for (int j = 0; j < D / 2; ++j) {
        const float* a = &x[(t * heads + h) * D];
        const float* b = &y[(t * heads + h) * D];
        double ang = double(float(pos[t]) * yarn.inv_freq[j]);
        double cs = std::cos(ang) * yarn.attention_scaling, sn = std::sin(ang) * yarn.attention_scaling;
        EXPECT_NEAR(b[j], a[j] * cs - a[j + 32] * sn, 1e-4);
        EXPECT_NEAR(b[j + 32], a[j + 32] * cs + a[j] * sn, 1e-4);
      }
}

// Naive attention in double with an explicit mask and the sink as an extra logit.
std::vector<float> naive_attention(const std::vector<float>& q, int n, int start, const std::vector<float>& k,
                                   const std::vector<float>& v, int Hq, int Hkv, int D, int window,
                                   const std::vector<float>& sinks) {
  std::vector<float> out(size_t(n) * Hq * D);
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < Hq; ++h) {
      int pos = start + t, kvh = h / (Hq / Hkv);
      std::vector<double> logit;
      std::vector<int> keys;
      for (int j = 0; j <= pos; ++j) {
        if (window > 0 && pos - j >= window) continue;
        double s = 0;
        for (int d = 0; d < D; ++d) s += double(q[(t * Hq + h) * D + d]) * k[(j * Hkv + kvh) * D + d];
        logit.push_back(s / std::sqrt(double(D)));
        keys.push_back(j);
      }
      double m = sinks[h];
      for (double l : logit) m = std::max(m, l);
      double den = std::exp(sinks[h] - m);
      for (double l : logit) den += std::exp(l - m);
      for (int d = 0; d < D; ++d) {
        double acc = 0;
        for (size_t i = 0; i < keys.size(); ++i) acc += std::exp(logit[i] - m) / den * v[(keys[i] * Hkv + kvh) * D + d];
        out[(t * Hq + h) * D + d] = float(acc);
      }
    }
  return out;
}

TEST(CpuOps, AttentionWithSinksAndWindow) {
  std::mt19937 rng(5);
  const int Hq = 8, Hkv = 2, D = 64;
  for (auto [n, start, window] : {std::tuple{1, 0, 0}, {1, 200, 128}, {33, 100, 128}, {20, 0, 8}, {5, 40, 0}}) {
    const int total = start + n;
    auto q = test::random_floats(size_t(n) * Hq * D, rng);
    auto k = test::random_floats(size_t(total) * Hkv * D, rng);
    auto v = test::random_floats(size_t(total) * Hkv * D, rng);
    auto sinks = test::random_floats(Hq, rng);
    auto ref = naive_attention(q, n, start, k, v, Hq, Hkv, D, window, sinks);
    std::vector<float> out(ref.size());
    // Pass only the keys the queries can see, as the backend does.
    int first = window > 0 ? std::max(0, start - window + 1) : 0;
    cpu::attention(q.data(), n, start, k.data() + size_t(first) * Hkv * D, v.data() + size_t(first) * Hkv * D, first,
                   total - first, Hq, Hkv, D, window, sinks.data(), out.data());
    // float32 scores, exp and weighted sums against double: measured up to 2.8e-7 over these
    // cases; 1e-6 leaves 3.5x. A key off the window's edge or a dropped sink is off by >1e-3.
    EXPECT_LE(test::rel_error(out.data(), ref.data(), ref.size()), 1e-6) << n << " " << start << " " << window;
  }
}

// Keys that do not cover what a query sees (here: no window, so from position 0, but keys given
// from 10 on) are an error, not a read before k's first row.
TEST(CpuOps, AttentionRejectsKeysThatDoNotCoverTheQueries) {
  const int Hq = 2, Hkv = 1, D = 8;
  std::vector<float> q(size_t(Hq) * D, 0.5f), k(size_t(20) * Hkv * D, 0.5f), v(k), out(q.size());
  std::vector<float> sinks(Hq, 0.0f);
  EXPECT_THROW(cpu::attention(q.data(), 1, 19, k.data(), v.data(), 10, 10, Hq, Hkv, D, 0, sinks.data(), out.data()),
               Error);
  // past the keys given
  EXPECT_THROW(cpu::attention(q.data(), 1, 20, k.data(), v.data(), 0, 20, Hq, Hkv, D, 0, sinks.data(), out.data()),
               Error);
  // a window of 10 sees 10 .. 19: fine
  EXPECT_NO_THROW(cpu::attention(q.data(), 1, 19, k.data(), v.data(), 10, 10, Hq, Hkv, D, 10, sinks.data(), out.data()));
}

TEST(CpuOps, RouterTopkSoftmax) {
  std::vector<float> logits = {0.1f, 3.0f, -1.0f, 2.0f, 2.5f, 0.0f};
  int32_t idx[2];
  float w[2];
  cpu::router_topk(logits.data(), 1, 6, 2, idx, w);
  EXPECT_EQ(idx[0], 1);
  EXPECT_EQ(idx[1], 4);
  EXPECT_NEAR(w[0], 1 / (1 + std::exp(-0.5)), 1e-6);
  EXPECT_NEAR(w[0] + w[1], 1.0, 1e-6);
}

// Exact ties resolve toward the lower expert index, as torch.topk does in transformers (the
// rule the tie fixture records; tests/tools/topk_ties.py prints it for CPU and CUDA). Each row
// puts a tie on the top-k boundary, where the rule decides which expert runs at all.
TEST(CpuOps, RouterTopkTiesGoToTheLowerIndex) {
  const int E = 8, k = 2;
  std::vector<float> logits = {
      0.5f, 1.0f, 0.2f, 1.0f, 1.0f, -1.f, 0.f, 0.3f,   // three-way tie for first: 1, 3
      3.0f, 0.1f, 0.7f, -2.f, 0.7f, 0.7f, 0.f, 0.7f,   // clear first, four-way tie for second: 2
      0.f,  0.f,  0.f,  0.f,  0.f,  0.f,  0.f, 0.f,    // all equal: 0, 1
      -1.f, -1.f, -1.f, -1.f, -1.f, -1.f, 2.f, 2.f};   // the last two tie for first: 6, 7
  const int n = int(logits.size()) / E;
  std::vector<int32_t> idx(n * k);
  std::vector<float> w(n * k);
  cpu::router_topk(logits.data(), n, E, k, idx.data(), w.data());
  EXPECT_EQ(idx, (std::vector<int32_t>{1, 3, 0, 2, 0, 1, 6, 7}));
  EXPECT_FLOAT_EQ(w[0], 0.5f);  // equal logits, equal weights
  EXPECT_FLOAT_EQ(w[4], 0.5f);
  EXPECT_FLOAT_EQ(w[6], 0.5f);
  // top-4 through a tie block: 0 first, then three of the four 0.7s in index order
  std::vector<int32_t> idx4(4);
  std::vector<float> w4(4);
  cpu::router_topk(&logits[E], 1, E, 4, idx4.data(), w4.data());
  EXPECT_EQ(idx4, (std::vector<int32_t>{0, 2, 4, 5}));
}

TEST(CpuOps, SwigluClampsAndInterleaves) {
  // gate, up pairs: limits apply to gate (max only) and up (both sides).
  std::vector<float> gu = {1.0f, 2.0f, 10.0f, -10.0f, -3.0f, 9.0f};
  std::vector<float> out(3);
  cpu::swiglu(gu.data(), 1, 3, 7.0f, out.data());
  auto f = [](double g, double u) { return g / (1 + std::exp(-1.702 * g)) * (u + 1); };
  EXPECT_NEAR(out[0], f(1, 2), 1e-6);
  EXPECT_NEAR(out[1], f(7, -7), 1e-5);
  EXPECT_NEAR(out[2], f(-3, 7), 1e-6);
}

}  // namespace
}  // namespace gptoss
