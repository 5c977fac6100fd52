#pragma once
// The arithmetic of the int8 screen of lm_head (lm_head_screen.cu), shared by its kernels and by
// the CPU test that checks the bound (tests/cuda/test_lm_head_screen_math.cpp).
//
// A greedy step needs only the argmax of the bf16 logits F_t = w_t . x. The screen reads an int8
// copy of lm_head (half the bytes): row t is q_t * s_t (q_t in [-127, 127], one scale a row), and
// the screen's logit S_t = s_t (q_t . x16) is computed from x16, the activations rounded to fp16
// (what the tensor cores take). Exactly,
//   w . x - s q . x16 = (w - s q) . x + s q . (x - x16)
// so, with every rounding of both kernels' fp32 accumulations bounded by gamma * sum |a_i b_i|
// (<= gamma ||a|| ||b||, Cauchy-Schwarz),
//   |F_t - S_t| <= ||w - s q|| ||x|| + s ||q|| ||x - x16|| + gamma (||w|| ||x|| + s ||q|| ||x16||) + |S_t| u'
//              =: r_t.
// A row can hold the maximum of F only if S_t + r_t >= max_j (S_j - r_j): every other row is
// below some row's lower bound. The candidates are then computed again in bf16 by the very
// kernel the full lm_head runs, and their argmax is the full argmax, bit for bit.
//
// The per-row factors (c1, c2, c3 below) are computed once at load, in double, from the exact
// weights; the step's three norms of x in fp32 by the screen kernel, each inflated by kNormSlack
// (2^-10, far above an fp32 sum of 2880 squares' relative error of ~2^-12 at worst).
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define GPTOSS_SCREEN_HD __host__ __device__
#else
#define GPTOSS_SCREEN_HD
#endif

namespace gptoss::cuda::screen {

// gamma = K * 2^-22: an fp32 accumulation of K products (exact products; a tensor core's MMA
// steps align to the largest term and truncate, ~2^-23 of the largest magnitude a step, and a
// K = 2880 row takes ~24 MMA steps a warp plus an 8-way sum: ~1e-4 of sum |a_i b_i|; gamma is
// 6.9e-4 there).
constexpr double kGammaPerK = 1.0 / 4194304.0;  // 2^-22
constexpr float kNormSlack = 1.0f + 1.0f / 1024.0f;
// |S_t| share of the radius: the scale's multiply and the rounding of S +- r (2^-20 >> 2^-24).
constexpr float kSumSlack = 1.0f / 1048576.0f;
// The radius's own fp32 sum of four positive terms (relative error <= 4 * 2^-24).
constexpr float kRadiusSlack = 1.0f + 1.0f / 65536.0f;

// One row's constants: S = scale * acc; r = c1 ||x|| + c2 ||x - x16|| + c3 ||x16|| + kSumSlack |S|.
struct RowConst {
  float scale, c1, c2, c3;
};

// The row's scale: the largest magnitude over 127 (1 for an all-zero or non-finite row: its q are
// then 0 or meaningless, and its error norm carries the whole row).
GPTOSS_SCREEN_HD inline float row_scale(float amax) {
  return amax > 0.f && amax < 3.0e38f ? amax / 127.f : 1.f;
}

// The one rounding of a weight to its int8 code (the packer and the row constants both call it).
GPTOSS_SCREEN_HD inline int quantize(float w, float scale) {
  const float v = w / scale;
  if (!(v == v)) return 0;  // NaN
  return int(rintf(fminf(fmaxf(v, -127.f), 127.f)));
}

// Rounds a non-negative double up to a float that is at least as large.
GPTOSS_SCREEN_HD inline float up(double v) {
  const float f = float(v);
  return double(f) >= v ? f : nextafterf(f, INFINITY);
}

// From the row's exact sums (double): err2 = sum (w - scale q)^2, w2 = sum w^2, q2 = sum q^2.
GPTOSS_SCREEN_HD inline RowConst row_constants(float scale, double err2, double w2, double q2, int K) {
  const double gamma = kGammaPerK * K, e = sqrt(err2), wn = sqrt(w2), a = double(scale) * sqrt(q2);
  // (1 + 2^-20): sqrt's and the products' roundings in double, with room.
  const double pad = 1.0 + 1.0 / 1048576.0;
  return RowConst{scale, up((e + gamma * wn) * pad), up(a * pad), up(gamma * a * pad)};
}

// The step's norms of its activation row (fp32 sums, inflated here).
struct StepNorms {
  float x, d, x16;  // ||x||, ||x - x16||, ||x16||
};
GPTOSS_SCREEN_HD inline StepNorms inflate(float x2, float d2, float x162) {
  return StepNorms{sqrtf(x2) * kNormSlack, sqrtf(d2) * kNormSlack, sqrtf(x162) * kNormSlack};
}

GPTOSS_SCREEN_HD inline float radius(const RowConst& c, const StepNorms& n, float S) {
  return (c.c1 * n.x + c.c2 * n.d + c.c3 * n.x16 + kSumSlack * fabsf(S)) * kRadiusSlack;
}

// Floats as order-preserving unsigned keys (NaN excluded by the callers): a > b <=> key(a) > key(b);
// 0 is below every float's key (-inf's is 0x007fffff), the "nothing yet" of an atomic max.
GPTOSS_SCREEN_HD inline uint32_t order_key(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// A row's (value, id) as one 64-bit key whose max is argmax_rows's pick: the largest value, the
// lowest id on ties, -0 and +0 equal. NaN values take no part (key 0).
GPTOSS_SCREEN_HD inline uint64_t argmax_key(float v, int id) {
  if (!(v == v)) return 0;
  if (v == 0.f) v = 0.f;  // -0 -> +0: argmax_rows compares with ==
  return (uint64_t(order_key(v)) << 32) | uint64_t(0xffffffffu - uint32_t(id));
}
GPTOSS_SCREEN_HD inline int32_t argmax_key_id(uint64_t k) {
  return k == 0 ? 0 : int32_t(0xffffffffu - uint32_t(k & 0xffffffffu));
}

}  // namespace gptoss::cuda::screen
