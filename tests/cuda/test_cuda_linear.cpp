// Dense linear kernels (kernels/linear) against the CPU reference on fresh random inputs, at gpt-oss
// shapes (hidden 2880, qkv 5120, o_proj 4096 in, vocab 201088) and awkward ones; outputs are poisoned
// (NaN) first.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <cstring>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/linear/lm_head_screen.h"
#include "backend/cuda/kernels/linear/lm_head_screen_math.h"

#include "kernel_test_fixture.h"

namespace gptoss {
namespace {

using namespace gptoss::test;
using cuda::Epilogue;
using cuda::WeightMat;

struct DenseCase {
  int M, N, K;
};

void check_dense(const DenseCase& c, int path) {
  FastRng r(fresh_seed());
  auto x = round_bf16(rand_f32(size_t(c.M) * c.K, r));
  auto wb = to_bf16(rand_f32(size_t(c.N) * c.K, r, 0.02f));
  auto bias = rand_f32(c.N, r, 0.1f);
  std::vector<float> ref(size_t(c.M) * c.N);
  cpu::linear_bf16(x.data(), c.M, c.K, wb.data(), c.N, bias.data(), ref.data());
  Dev<uint16_t> dx(to_bf16(x)), dw(wb);
  Dev<float> db(bias), dy(ref.size());
  WeightMat W{WeightMat::kBF16, dw.p(), nullptr, db.p(), c.N, c.K};
  cuda::set_linear_path(path);
  cuda::linear(W, dx.p(), c.K, c.M, Epilogue{Epilogue::kStoreF32, dy.p(), c.N}, 0);
  double e = rel_err(dy.download(), ref);
  EXPECT_LE(e, 2e-3) << "M=" << c.M << " N=" << c.N << " K=" << c.K << " path=" << path;
  // Residual add and bf16 store epilogues.
  auto res = rand_f32(ref.size(), r);
  dy.upload(res);
  cuda::linear(W, dx.p(), c.K, c.M, Epilogue{Epilogue::kAddF32, dy.p(), c.N}, 0);
  std::vector<float> ref2(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) ref2[i] = ref[i] + res[i];
  EXPECT_LE(rel_err(dy.download(), ref2), 2e-3) << "add, M=" << c.M;
  Dev<uint16_t> dyb(ref.size());
  cuda::linear(W, dx.p(), c.K, c.M, Epilogue{Epilogue::kStoreBF16, dyb.p(), c.N}, 0);
  EXPECT_LE(rel_err(from_bf16(dyb.download()), ref), 6e-3) << "bf16, M=" << c.M;
}

TEST_F(Kernels, LinearBF16) {
  // Decode GEMVs at qkv / o_proj / router shapes for 1..4 tokens (the whole-row kernel) and for
  // more (row pairs), narrow matrices (K split over warps), prefill GEMMs.
  std::vector<DenseCase> cases = {{1, 5120, 2880}, {3, 5121, 2880}, {1, 2880, 4096}, {4, 2880, 4096},
                                  {33, 2880, 4096}, {129, 128, 2880}, {4, 520, 64}, {2049, 200, 96}};
  if (small_mode()) cases = {{1, 72, 64}, {33, 136, 96}, {5, 8, 64}, {2, 3000, 96}};
  for (auto& c : cases)
    for (int path : {0, 1, 2}) check_dense(c, path);
  // The first decode GEMV (row pairs) for every shape too: benchmarks compare against it.
  cuda::set_gemv_variant(1);
  for (auto& c : cases) check_dense(c, 1);
  cuda::set_gemv_variant(0);
}

// RMSNorm fused into the GEMV (decode sizes) and its fallback (rmsnorm pass + linear), against
// the CPU's norm -> bf16 -> linear; the normalized rows it may leave behind are checked too.
TEST_F(Kernels, LinearRmsNorm) {
  struct C { int M, N, K; };
  std::vector<C> cases = {{1, 5120, 2880}, {4, 5120, 2880}, {1, 128, 2880}, {3, 128, 2880}, {8, 2880, 2880},
                          {33, 136, 2880}, {5, 9, 64}};
  if (small_mode()) cases = {{1, 72, 64}, {3, 8, 96}, {9, 16, 64}, {2, 2200, 64}};
  for (const C& c : cases)
    for (int path : {0, 1, 2})
      for (bool need_xn : {false, true}) {
        FastRng r(fresh_seed());
        auto x = rand_f32(size_t(c.M) * c.K, r, 3.f);
        auto nw = rand_f32(c.K, r, 0.1f, 1.f);
        auto wb = to_bf16(rand_f32(size_t(c.N) * c.K, r, 0.02f));
        auto bias = rand_f32(c.N, r, 0.1f);
        std::vector<float> xn(x.size()), ref(size_t(c.M) * c.N);
        cpu::rmsnorm(x.data(), nw.data(), c.M, c.K, 1e-5f, xn.data());
        xn = round_bf16(xn);
        cpu::linear_bf16(xn.data(), c.M, c.K, wb.data(), c.N, bias.data(), ref.data());
        Dev<float> dx(x), dnw(nw), db(bias), dy(ref.size());
        Dev<uint16_t> dw(wb), dxn(std::vector<uint16_t>(x.size(), 0x7fc0));  // NaN: must be overwritten if asked
        WeightMat W{WeightMat::kBF16, dw.p(), nullptr, db.p(), c.N, c.K};
        cuda::set_linear_path(path);
        cuda::linear_rmsnorm(W, dx.p(), dnw.p(), 1e-5f, c.M, dxn.p(), need_xn,
                             Epilogue{Epilogue::kStoreF32, dy.p(), c.N}, 0);
        EXPECT_LE(rel_err(dy.download(), ref), 2e-3)
            << "M=" << c.M << " N=" << c.N << " K=" << c.K << " path=" << path << " need_xn=" << need_xn;
        if (need_xn) {
          EXPECT_LE(rel_err(from_bf16(dxn.download()), xn), 5e-3) << "xn, M=" << c.M << " path=" << path;
        }
      }
}

TEST_F(Kernels, LinearLmHeadVocab) {
  if (small_mode()) GTEST_SKIP() << "large";
  check_dense({1, 201088, 2880}, 0);
  check_dense({3, 201088, 2880}, 2);
}

// Dense MXFP4 weights (--mxfp4-layers: qkv, o_proj, lm_head quantized at load): GEMV (K up to
// 4096, the o_proj shape takes the 4-chunks-a-lane variant) and GEMM against the CPU.
TEST_F(Kernels, LinearMxfp4Dense) {
  std::vector<DenseCase> cases = {{1, 5120, 2880}, {3, 5120, 2880}, {1, 2880, 4096}, {4, 2880, 4096},
                                  {8, 2880, 4096}, {33, 2880, 4096}, {2, 1000, 64}};
  if (small_mode()) cases = {{1, 72, 64}, {3, 40, 128}, {9, 16, 64}};
  for (const DenseCase& c : cases)
    for (int path : {0, 1, 2}) {
      FastRng r(fresh_seed());
      auto x = round_bf16(rand_f32(size_t(c.M) * c.K, r));
      auto blocks = rand_bytes(r, size_t(c.N) * c.K / 2), scales = rand_bytes(r, size_t(c.N) * c.K / 32, 118, 121);
      auto bias = rand_f32(c.N, r, 0.1f);
      std::vector<float> ref(size_t(c.M) * c.N);
      cpu::linear_mxfp4(x.data(), c.M, c.K, blocks.data(), scales.data(), c.N, bias.data(), ref.data());
      Dev<uint16_t> dx(to_bf16(x));
      Dev<uint8_t> db(blocks), ds(scales);
      Dev<float> dbias(bias), dy(ref.size());
      WeightMat W{WeightMat::kMXFP4, db.p(), ds.p(), dbias.p(), c.N, c.K};
      cuda::set_linear_path(path);
      cuda::linear(W, dx.p(), c.K, c.M, Epilogue{Epilogue::kStoreF32, dy.p(), c.N}, 0);
      EXPECT_LE(rel_err(dy.download(), ref), 2e-3) << "M=" << c.M << " N=" << c.N << " K=" << c.K << " path=" << path;
      auto res = rand_f32(ref.size(), r);
      dy.upload(res);
      cuda::linear(W, dx.p(), c.K, c.M, Epilogue{Epilogue::kAddF32, dy.p(), c.N}, 0);
      for (size_t i = 0; i < ref.size(); ++i) ref[i] += res[i];
      EXPECT_LE(rel_err(dy.download(), ref), 2e-3) << "add, M=" << c.M << " K=" << c.K << " path=" << path;
    }
}

// Tensor-core decode kernels over fragment-layout weights (kernels/linear/skinny_mma.cu), dense:
// bf16, fp8 (quantized on the device; the reference uses the same e4m3 codes, rebuilt on the host
// from the device's row scales) and MXFP4, at real shapes and awkward ones, for every token regime
// (1 n-tile: 1-8 tokens; 2: 9-16; 4 with a second pass: 33-64), with each epilogue.

void check_skinny_dense(WeightMat::Format fmt, const DenseCase& c) {
  FastRng r(fresh_seed());
  auto x = round_bf16(rand_f32(size_t(c.M) * c.K, r));
  auto bias = rand_f32(c.N, r, 0.1f);
  std::vector<float> ref(size_t(c.M) * c.N);
  Dev<float> db(bias), dy(ref.size());
  Dev<uint8_t> dwf(cuda::frag_weight_bytes(fmt, 1, c.N, c.K));
  Dev<int> flag(std::vector<int>{0});
  WeightMat P;
  if (fmt == WeightMat::kFragMXFP4) {
    auto blocks = rand_bytes(r, size_t(c.N) * c.K / 2), scales = rand_bytes(r, size_t(c.N) * c.K / 32, 116, 123);
    cpu::linear_mxfp4(x.data(), c.M, c.K, blocks.data(), scales.data(), c.N, bias.data(), ref.data());
    Dev<uint8_t> dbl(blocks), dsc(scales), daux(scales.size());
    WeightMat W{WeightMat::kMXFP4, dbl.p(), dsc.p(), db.p(), c.N, c.K};
    P = cuda::pack_frag(W, 1, false, fmt, dwf.p(), daux.p(), flag.p(), 0);
    GPTOSS_CUDA_CHECK(cudaDeviceSynchronize());
    Dev<uint16_t> dx(to_bf16(x));
    cuda::linear(P, dx.p(), c.K, c.M, Epilogue{Epilogue::kStoreF32, dy.p(), c.N}, 0);
    double e = rel_err(dy.download(), ref);
    EXPECT_LE(e, 2e-3) << "mxfp4 M=" << c.M << " N=" << c.N << " K=" << c.K;
    return;
  }
  auto wb = to_bf16(rand_f32(size_t(c.N) * c.K, r, 0.02f));
  Dev<uint16_t> dw(wb), dx(to_bf16(x));
  Dev<float> dscale(size_t(c.N));
  WeightMat W{WeightMat::kBF16, dw.p(), nullptr, db.p(), c.N, c.K};
  P = cuda::pack_frag(W, 1, false, fmt, dwf.p(), dscale.p(), flag.p(), 0);
  const std::vector<uint16_t> weff = fmt == WeightMat::kFragFP8 ? fp8_effective(wb, dscale.download(), c.N, c.K) : wb;
  cpu::linear_bf16(x.data(), c.M, c.K, weff.data(), c.N, bias.data(), ref.data());
  const double bound = fmt == WeightMat::kFragFP8 ? 6e-3 : 2e-3;
  cuda::linear(P, dx.p(), c.K, c.M, Epilogue{Epilogue::kStoreF32, dy.p(), c.N}, 0);
  double e = rel_err(dy.download(), ref);
  EXPECT_LE(e, bound) << "fmt=" << fmt << " M=" << c.M << " N=" << c.N << " K=" << c.K;
  auto res = rand_f32(ref.size(), r);
  dy.upload(res);
  cuda::linear(P, dx.p(), c.K, c.M, Epilogue{Epilogue::kAddF32, dy.p(), c.N}, 0);
  std::vector<float> ref2(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) ref2[i] = ref[i] + res[i];
  EXPECT_LE(rel_err(dy.download(), ref2), bound) << "add, fmt=" << fmt << " M=" << c.M;
  Dev<uint16_t> dyb(ref.size());
  cuda::linear(P, dx.p(), c.K, c.M, Epilogue{Epilogue::kStoreBF16, dyb.p(), c.N}, 0);
  EXPECT_LE(rel_err(from_bf16(dyb.download()), ref), bound + 4e-3) << "bf16 out, fmt=" << fmt << " M=" << c.M;
}

TEST_F(Kernels, SkinnyDense) {
  std::vector<DenseCase> cases;
  for (int M : {1, 2, 3, 4, 7, 8, 9, 16, 17, 33, 64}) {  // 1-4: staged weights (skinny_mma.cu)
    cases.push_back({M, 5120, 2880});
    cases.push_back({M, 2880, 4096});
  }
  for (int M : {1, 8}) {  // one rank's qkv and o_proj at TP=2 (o_proj's K = 2048 has its own chunk count)
    cases.push_back({M, 2560, 2880});
    cases.push_back({M, 2880, 2048});
  }
  cases.push_back({3, 48, 128});
  cases.push_back({64, 16, 64});
  // Stream-K at <= 8 tokens: jobs split over many warps (few tiles, as 48 x 128), a job per
  // chunk (K = 64: every job whole in one warp), tails of uneven shares (4000 tiles x 3 chunks).
  cases.push_back({1, 64000, 64});
  cases.push_back({5, 16 * 4000, 192});
  cases.push_back({8, 16, 2880});
  // (Small mode, for the sanitizers, keeps one qkv and one o_proj shape at 1-2 tokens: the kernels
  // whose weights the bulk-copy engine stages in shared memory.)
  if (small_mode()) cases = {{1, 32, 128}, {9, 48, 64}, {33, 16, 192}, {2, 5120, 2880}, {1, 2880, 4096}};
  for (int family : {0, 1}) {  // stream-K (<= 8 tokens) and the block-per-tile skinny kernel
    cuda::set_decode_kernel_choice(family);
    for (auto fmt : {WeightMat::kFragBF16, WeightMat::kFragFP8, WeightMat::kFragMXFP4})
      for (const DenseCase& c : cases) check_skinny_dense(fmt, c);
  }
}

// The int8 screen of lm_head (kernels/linear/lm_head_screen.cu): for greedy rows it must give the
// ids argmax_rows gives over the full skinny kernel's logits, bit for bit, and leave every row it
// recomputes equal to that kernel's logit. Fresh random weights and activations at the real
// vocabulary and at awkward sizes (the smallest grid the skinny kernel's 8x2 shape takes, a K
// without a compile-time chunk count), 1-8 rows, an exact tie for the maximum moved to a lower id,
// and the fallback (every pair recomputed) where the bounds are not finite: a NaN in a row, an
// activation past fp16's range. Where the bounds are finite, every full logit of every row is
// checked against its upper bound as the screen kernel left it (the radius as the GPU computes it,
// over the tensor cores' own sums), also for an activation along one row's int8 rounding error,
// where the bound's main term is nearly reached (kAligned).
enum class ScreenInput { kRandom, kTie, kNaN, kPastFp16, kAligned };

void check_screen(int N, int K, const std::vector<int>& Ms, ScreenInput in) {
  FastRng r(fresh_seed());
  auto wb = to_bf16(rand_f32(size_t(N) * K, r, 0.02f));
  const int maxM = *std::max_element(Ms.begin(), Ms.end());
  auto x = round_bf16(rand_f32(size_t(maxM) * K, r));
  Dev<uint16_t> dx(to_bf16(x));
  Dev<int32_t> ids_full(8), ids(8);
  Dev<float> full(size_t(maxM) * N);
  auto full_argmax = [&](const WeightMat& P, int M) {
    cuda::linear(P, dx.p(), K, M, Epilogue{Epilogue::kStoreF32, full.p(), N}, 0);
    cuda::argmax_rows(full.p(), M, N, ids_full.p(), 0);
  };
  Dev<uint8_t> dwf(cuda::frag_weight_bytes(WeightMat::kFragBF16, 1, N, K));
  Dev<int> flag(std::vector<int>{0});
  int tie_low = -1, tie_high = -1;  // kTie: the two equal rows that hold row 0's maximum
  if (in == ScreenInput::kTie) {
    // The first row's winner copied to a row of another pair at a lower id: two exact maxima.
    Dev<uint16_t> dw(wb);
    WeightMat P = cuda::pack_frag(WeightMat{WeightMat::kBF16, dw.p(), nullptr, nullptr, N, K}, 1, false,
                                  WeightMat::kFragBF16, dwf.p(), nullptr, flag.p(), 0);
    full_argmax(P, 1);
    const int win = ids_full.download()[0];
    const int to = win >= 64 ? win / 2 - 32 : win + 64;  // another 32-row pair
    std::copy(wb.begin() + size_t(win) * K, wb.begin() + size_t(win + 1) * K, wb.begin() + size_t(to) * K);
    tie_low = std::min(win, to);
    tie_high = std::max(win, to);
  }
  if (in == ScreenInput::kNaN) x[7] = std::nanf("");  // (row 0: in every M)
  if (in == ScreenInput::kAligned) {
    // Activation row 0 along weight row 5's error w - s q (the screen's own rounding rule), so
    // F_5 - S_5 is ~||w - s q|| ||x||, the radius's first term at its Cauchy-Schwarz size.
    const int row = 5;
    float amax = 0.f;
    for (int k = 0; k < K; ++k) amax = std::max(amax, std::fabs(bf16_to_f32(wb[size_t(row) * K + k])));
    const float scale = cuda::screen::row_scale(amax);
    double en = 0;
    std::vector<double> e(K);
    for (int k = 0; k < K; ++k) {
      const float w = bf16_to_f32(wb[size_t(row) * K + k]);
      e[k] = double(w) - double(scale) * cuda::screen::quantize(w, scale);
      en += e[k] * e[k];
    }
    en = std::sqrt(en);
    for (int k = 0; k < K; ++k) x[k] = bf16_to_f32(f32_to_bf16(float(e[k] / en * 40.0)));
  }
  if (in == ScreenInput::kPastFp16) x[5] = 70144.f;  // a bf16 that fp16 holds as inf
  dx.upload(to_bf16(x));
  Dev<uint16_t> dw(wb);
  const WeightMat W{WeightMat::kBF16, dw.p(), nullptr, nullptr, N, K};
  const WeightMat P = cuda::pack_frag(W, 1, false, WeightMat::kFragBF16, dwf.p(), nullptr, flag.p(), 0);
  cuda::LmHeadScreen sc;
  sc.build(W, 0);
  long long pairs_before = 0;
  for (int M : Ms) {
    const std::string what = "N=" + std::to_string(N) + " K=" + std::to_string(K) + " M=" + std::to_string(M) +
                             " input " + std::to_string(int(in));
    ASSERT_TRUE(cuda::lm_head_screen_takes(P, M, false)) << what;
    full_argmax(P, M);
    const std::vector<int32_t> want = ids_full.download();
    const std::vector<float> fl = full.download();
    for (int rep = 0; rep < 2; ++rep) {  // again: the step's scratch was reset by its last block
      Dev<float> part(size_t(M) * N);  // poisoned: NaN bits where no pair was recomputed
      ids.poison();
      sc.argmax(P, dx.p(), K, M, part.p(), N, ids.p(), false, 0);
      const std::vector<int32_t> got = ids.download();
      for (int t = 0; t < M; ++t) EXPECT_EQ(got[t], want[t]) << what << " row " << t << " rep " << rep;
      if (in == ScreenInput::kTie && fl[tie_low] == fl[tie_high]) {  // (equal rows: equal logits)
        EXPECT_EQ(got[0], tie_low) << what;  // the lower copy, as argmax_rows picks
      }
      const std::vector<float> pl = part.download();
      size_t written = 0;
      uint32_t poison;
      std::memset(&poison, 0xff, 4);
      for (size_t i = 0; i < pl.size(); ++i) {
        uint32_t a, b;
        std::memcpy(&a, &pl[i], 4);
        std::memcpy(&b, &fl[i], 4);
        if (a == poison) continue;
        ++written;
        ASSERT_EQ(a, b) << what << " logit " << i % N << " of row " << i / N << " differs from the full kernel's";
      }
      for (int t = 0; t < M; ++t) {  // each row's winner was recomputed
        uint32_t a;
        std::memcpy(&a, &pl[size_t(t) * N + want[t]], 4);
        if (std::isfinite(fl[size_t(t) * N + want[t]])) {
          EXPECT_NE(a, poison) << what << " row " << t;
        }
      }
      const bool finite_bounds = in != ScreenInput::kNaN && in != ScreenInput::kPastFp16;
      if (finite_bounds) {  // every full logit at or below the screen's upper bound for it
        std::vector<float> up(size_t(cuda::LmHeadScreen::kMaxRows) * N);
        ASSERT_EQ(cudaSuccess, cudaMemcpy(up.data(), sc.upper_bounds(), up.size() * 4, cudaMemcpyDeviceToHost));
        double min_gap = INFINITY;
        for (int t = 0; t < M; ++t)
          for (int n = 0; n < N; ++n) {
            const float F = fl[size_t(t) * N + n], U = up[size_t(t) * N + n];
            ASSERT_LE(F, U) << what << " row " << t << " logit " << n << ": above its upper bound";
            min_gap = std::min(min_gap, double(U) - F);
          }
        if (rep == 0) std::printf("lm_head screen %s: smallest upper bound - logit %.3g\n", what.c_str(), min_gap);
      }
      const cuda::LmHeadScreen::Stats st = sc.stats(0);
      const long long pairs = st.pairs - pairs_before;
      pairs_before = st.pairs;
      EXPECT_EQ(size_t(pairs) * 32 * M, written) << what;
      if (in == ScreenInput::kRandom || in == ScreenInput::kTie || in == ScreenInput::kAligned) {
        EXPECT_LT(pairs, N / 32 / 4) << what;  // a screen, not the whole matrix again
      } else {
        EXPECT_EQ(pairs, N / 32) << what;  // the fallback: every pair
      }
      if (rep == 0)
        std::printf("lm_head screen %s: %lld of %d tile pairs recomputed\n", what.c_str(), pairs, N / 32);
    }
  }
}

// Where every logit is -inf or NaN the sampler's greedy rule gives id 0 and argmax_rows the lowest
// -inf: row 0 NaN (a NaN weight), the others -inf (a positive column against an activation of
// -inf). The screen gives either, as asked (every pair recomputed: no bound is finite).
TEST_F(Kernels, LmHeadScreenSamplerRuleAtMinusInfinity) {
  const int N = 16 * 8 * 132, K = 64;
  FastRng r(fresh_seed());
  auto w = rand_f32(size_t(N) * K, r, 0.02f);
  for (int n = 0; n < N; ++n) w[size_t(n) * K] = 0.01f;
  w[3] = std::nanf("");
  auto x = round_bf16(rand_f32(K, r));
  x[0] = -INFINITY;
  Dev<uint16_t> dw(to_bf16(w)), dx(to_bf16(x));
  const WeightMat W{WeightMat::kBF16, dw.p(), nullptr, nullptr, N, K};
  Dev<uint8_t> dwf(cuda::frag_weight_bytes(WeightMat::kFragBF16, 1, N, K));
  Dev<int> flag(std::vector<int>{0});
  const WeightMat P = cuda::pack_frag(W, 1, false, WeightMat::kFragBF16, dwf.p(), nullptr, flag.p(), 0);
  cuda::set_decode_kernel_choice(1);
  Dev<float> full{size_t(N)}, part{size_t(N)};
  Dev<int32_t> ids(1);
  cuda::linear(P, dx.p(), K, 1, Epilogue{Epilogue::kStoreF32, full.p(), N}, 0);
  cuda::argmax_rows(full.p(), 1, N, ids.p(), 0);
  ASSERT_EQ(ids.download()[0], 1);
  const std::vector<float> fl = full.download();
  ASSERT_TRUE(std::isnan(fl[0]));
  ASSERT_EQ(fl[1], -INFINITY);
  cuda::LmHeadScreen sc;
  sc.build(W, 0);
  sc.argmax(P, dx.p(), K, 1, part.p(), N, ids.p(), false, 0);
  EXPECT_EQ(ids.download()[0], 1) << "argmax_rows's rule";
  sc.argmax(P, dx.p(), K, 1, part.p(), N, ids.p(), false, 0, true);
  EXPECT_EQ(ids.download()[0], 0) << "the sampler's rule";
}

TEST_F(Kernels, LmHeadScreenMatchesArgmaxRows) {
  cuda::set_decode_kernel_choice(1);  // the block-per-tile skinny kernel (the default family)
  const int small_n = 16 * 8 * 132;   // the smallest grid the full kernel runs in its 8x2 shape
  if (!small_mode()) {
    check_screen(201088, 2880, {1, 2, 7, 8}, ScreenInput::kRandom);
    check_screen(201088, 2880, {1}, ScreenInput::kNaN);
  }
  check_screen(small_n, 64, {1, 3, 8}, ScreenInput::kRandom);
  check_screen(small_n + 5 * 32, 192, {1, 8}, ScreenInput::kRandom);
  check_screen(small_n, 128, {1, 2}, ScreenInput::kTie);
  check_screen(small_mode() ? small_n : 201088, small_mode() ? 192 : 2880, {1, 3}, ScreenInput::kAligned);
  check_screen(small_n, 64, {2, 5}, ScreenInput::kNaN);
  check_screen(small_n, small_mode() ? 192 : 2880, {1, 4}, ScreenInput::kPastFp16);
  // The shapes it declines: past 8 rows, a grid the 8x2 shape does not run, fp8 decode copies.
  WeightMat P{WeightMat::kFragBF16, nullptr, nullptr, nullptr, 201088, 2880};
  EXPECT_FALSE(cuda::lm_head_screen_takes(P, 9, false));
  P.N = small_n - 32;
  EXPECT_FALSE(cuda::lm_head_screen_takes(P, 1, false));
  P.N = 201088;
  P.fmt = WeightMat::kFragFP8;
  EXPECT_FALSE(cuda::lm_head_screen_takes(P, 1, false));
}

// Stream-K sums a split tile's partials in warp order: the same bits on every run (its job
// counters are re-zeroed by each finisher, so a later launch splits and finishes the same way).
TEST_F(Kernels, StreamKRepeatsBitForBit) {
  const int M = 3, N = small_mode() ? 64 : 5120, K = small_mode() ? 192 : 2880;
  FastRng r(fresh_seed());
  auto blocks = rand_bytes(r, size_t(N) * K / 2), scales = rand_bytes(r, size_t(N) * K / 32, 116, 123);
  auto x = round_bf16(rand_f32(size_t(M) * K, r));
  auto bias = rand_f32(N, r, 0.1f);
  std::vector<float> ref(size_t(M) * N);
  cpu::linear_mxfp4(x.data(), M, K, blocks.data(), scales.data(), N, bias.data(), ref.data());
  Dev<uint8_t> dbl(blocks), dsc(scales), dwf(cuda::frag_weight_bytes(WeightMat::kFragMXFP4, 1, N, K)), daux(scales.size());
  Dev<float> db(bias), dy(ref.size());
  Dev<int> flag(std::vector<int>{0});
  Dev<uint16_t> dx(to_bf16(x));
  WeightMat W{WeightMat::kMXFP4, dbl.p(), dsc.p(), db.p(), N, K};
  WeightMat P = cuda::pack_frag(W, 1, false, WeightMat::kFragMXFP4, dwf.p(), daux.p(), flag.p(), 0);
  cuda::set_decode_kernel_choice(0);
  ASSERT_EQ(cuda::choose_linear_kernel({P.fmt, M, M, N, K, false, 0}), cuda::LinearKernel::kStreamK);
  std::vector<float> first;
  for (int run = 0; run < 4; ++run) {
    dy.upload(std::vector<float>(ref.size(), std::nanf("")));
    cuda::linear(P, dx.p(), K, M, Epilogue{Epilogue::kStoreF32, dy.p(), N}, 0);
    auto y = dy.download();
    EXPECT_LE(rel_err(y, ref), 2e-3) << "run " << run;
    if (run == 0) first = y;
    else EXPECT_EQ(0, std::memcmp(first.data(), y.data(), y.size() * sizeof(float))) << "run " << run;
  }
}

}  // namespace
}  // namespace gptoss
