// Every CUDA kernel against the CPU reference (backend/cpu/cpu_ops.h) on fresh random inputs, at
// gpt-oss shapes (hidden 2880, 64/8 heads of 64, 128 experts top-4, vocab 201088) and awkward
// ones (1, 33, 129, 2049 tokens; contexts crossing 128). Outputs are poisoned (NaN) first.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/moe/expert_gemm_v5.h"
#include "cuda_test_util.h"

namespace gptoss {
namespace {

using namespace gptoss::test;
using cuda::Epilogue;
using cuda::WeightMat;

class Kernels : public CudaTest {
 protected:
  void TearDown() override {
    cuda::set_linear_path(0);
    cuda::set_gemv_variant(0);
    cuda::set_expert_gemm_version(0);
    cuda::set_decode_kernel_choice(-1);  // back to GPTOSS_DECODE_KERNEL's choice
    cuda::set_router_variant(0);
    cuda::set_combine_variant(0);
  }
};

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
// The bf16 weights an fp8 decode copy holds in effect: each rounded to e4m3 at its row's scale.
std::vector<uint16_t> fp8_effective(const std::vector<uint16_t>& wb, const std::vector<float>& rs, int N, int K) {
  std::vector<uint16_t> weff = wb;
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) {
      float w = bf16_to_f32(wb[size_t(n) * K + k]);
      float q = fp8_e4m3_to_f32(f32_to_fp8_e4m3(w * (1.f / rs[n]))) * rs[n];
      weff[size_t(n) * K + k] = f32_to_bf16(q);  // q * rs is not always a bf16; the bounds cover it
    }
  return weff;
}

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

// One MoE block: route -> gate_up (MXFP4, SwiGLU epilogue) -> down (MXFP4, scatter-add).
struct MoeCase {
  int n, E, k, H, I;
};

void check_moe(const MoeCase& c, int path) {
  FastRng r(fresh_seed());
  const int n = c.n, E = c.E, k = c.k, H = c.H, I = c.I;
  auto x = round_bf16(rand_f32(size_t(n) * H, r));
  auto logits = rand_f32(size_t(n) * E, r);
  auto gu_b = rand_bytes(r, size_t(E) * 2 * I * H / 2, 0, 255), gu_s = rand_bytes(r, size_t(E) * 2 * I * H / 32, 118, 121);
  auto dn_b = rand_bytes(r, size_t(E) * H * I / 2, 0, 255), dn_s = rand_bytes(r, size_t(E) * H * I / 32, 118, 121);
  auto gu_bias = rand_f32(size_t(E) * 2 * I, r, 0.1f), dn_bias = rand_f32(size_t(E) * H, r, 0.1f);

  // CPU reference.
  std::vector<int32_t> idx(size_t(n) * k);
  std::vector<float> wts(size_t(n) * k), ref(size_t(n) * H, 0.f);
  cpu::router_topk(logits.data(), n, E, k, idx.data(), wts.data());
  for (int e = 0; e < E; ++e) {
    std::vector<int> toks;
    std::vector<float> tw;
    for (int t = 0; t < n; ++t)
      for (int j = 0; j < k; ++j)
        if (idx[size_t(t) * k + j] == e) { toks.push_back(t); tw.push_back(wts[size_t(t) * k + j]); }
    if (toks.empty()) continue;
    const int m = int(toks.size());
    std::vector<float> xs(size_t(m) * H), gu(size_t(m) * 2 * I), act(size_t(m) * I), y(size_t(m) * H);
    for (int i = 0; i < m; ++i) std::copy_n(&x[size_t(toks[i]) * H], H, &xs[size_t(i) * H]);
    cpu::linear_mxfp4(xs.data(), m, H, &gu_b[size_t(e) * 2 * I * H / 2], &gu_s[size_t(e) * 2 * I * H / 32], 2 * I,
                      &gu_bias[size_t(e) * 2 * I], gu.data());
    cpu::swiglu(gu.data(), m, I, 7.f, act.data());
    cpu::linear_mxfp4(act.data(), m, I, &dn_b[size_t(e) * H * I / 2], &dn_s[size_t(e) * H * I / 32], H,
                      &dn_bias[size_t(e) * H], y.data());
    for (int i = 0; i < m; ++i)
      for (int h = 0; h < H; ++h) ref[size_t(toks[i]) * H + h] += tw[i] * y[size_t(i) * H + h];
  }

  // GPU.
  const int P = n * k;
  Dev<uint16_t> dx(to_bf16(x));
  Dev<float> dlog(logits), dgub(gu_bias), ddnb(dn_bias);
  Dev<uint8_t> dgu_b(gu_b), dgu_s(gu_s), ddn_b(dn_b), ddn_s(dn_s);
  Dev<uint8_t> rmem(cuda::moe_routing_bytes(P, E));
  auto rt = cuda::moe_routing_carve(rmem.p(), P, E);
  Dev<uint16_t> act(size_t(P) * I);
  Dev<float> out(std::vector<float>(size_t(n) * H, 0.f));
  cuda::moe_route(dlog.p(), n, E, k, rt, 0);
  WeightMat gu{WeightMat::kMXFP4, dgu_b.p(), dgu_s.p(), dgub.p(), 2 * I, H};
  WeightMat dn{WeightMat::kMXFP4, ddn_b.p(), ddn_s.p(), ddnb.p(), H, I};
  if (path < 3) {  // 0-2: linear paths on the checkpoint layout; 3: the backend's; 4: 3 with k-permuted hand-offs
    cuda::set_linear_path(path);
    cuda::linear_grouped(gu, dx.p(), H, P, E, true, rt, Epilogue{Epilogue::kSwiGLU, act.p(), I}, 0);
    cuda::linear_grouped(dn, act.p(), I, P, E, false, rt, Epilogue{Epilogue::kScatterAdd, out.p(), H}, 0);
  } else {
    // The backend's layout and order: experts repacked (gate/up rows paired), skinny kernels at
    // decode sizes (fp16 SwiGLU output), the GEMM on the fragment layout past them, expert
    // outputs summed by moe_combine in a fixed order.
    Dev<uint8_t> fgu(cuda::frag_weight_bytes(WeightMat::kFragMXFP4, E, 2 * I, H)), fgus(gu_s.size());
    Dev<uint8_t> fdn(cuda::frag_weight_bytes(WeightMat::kFragMXFP4, E, H, I)), fdns(dn_s.size());
    Dev<int> flag(std::vector<int>{0});
    WeightMat pgu = cuda::pack_frag(gu, E, true, WeightMat::kFragMXFP4, fgu.p(), fgus.p(), flag.p(), 0);
    WeightMat pdn = cuda::pack_frag(dn, E, false, WeightMat::kFragMXFP4, fdn.p(), fdns.p(), flag.p(), 0);
    const bool skinny = cuda::is_skinny_family(cuda::choose_linear_kernel({pgu.fmt, P, n, pgu.N, pgu.K, true, 0}));
    Epilogue ge{Epilogue::kSwiGLU, act.p(), I};
    ge.out_f16 = skinny;
    Dev<float> y(size_t(P) * H);
    const Epilogue de{Epilogue::kStoreF32, y.p(), H};
    // path 4: gate_up reads the rows permuted into the fragment K order and stores SwiGLU that
    // way, down reads it so (the backend's prefill on version 5).
    const bool kperm = path == 4;
    if (kperm) {
      EXPECT_TRUE(cuda::expert_gemm_v5_runs(pgu, dx.p(), H, P, E, true, ge, n));
      EXPECT_TRUE(cuda::expert_gemm_v5_runs(pdn, act.p(), I, P, E, false, de, n));
    }
    Dev<uint16_t> dxp(size_t(n) * H);
    if (kperm) cuda::permute_rows_frag_k(reinterpret_cast<const cuda::bf16_t*>(dx.p()), n, H, reinterpret_cast<cuda::bf16_t*>(dxp.p()), 0);
    ge.k_permuted = kperm;
    cuda::linear_grouped(pgu, kperm ? dxp.p() : dx.p(), H, P, E, true, rt, ge, 0, n, false, false, kperm);
    // As in the model: down's routing is two launches old, read before its wait.
    cuda::MoeRouting settled = rt;
    settled.settled = true;
    cuda::linear_grouped(pdn, act.p(), I, P, E, false, settled, de, 0, n, skinny, false, kperm);
    cuda::moe_combine(y.p(), rt, n, k, H, out.p(), nullptr, 1e-5f, nullptr, 0);
    GPTOSS_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(flag.download()[0], 0);
  }
  GPTOSS_CUDA_CHECK(cudaDeviceSynchronize());
  // Routing itself: same experts (logits are distinct), same weights.
  std::vector<int32_t> gidx(P);
  std::vector<float> gw(P);
  GPTOSS_CUDA_CHECK(cudaMemcpy(gidx.data(), rt.topk_idx, P * 4, cudaMemcpyDeviceToHost));
  GPTOSS_CUDA_CHECK(cudaMemcpy(gw.data(), rt.topk_w, P * 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(gidx, idx) << "top-k experts";
  EXPECT_LE(rel_err(gw, wts), 1e-5);
  double e = rel_err(out.download(), ref);
  EXPECT_LE(e, 1e-2) << "n=" << n << " E=" << E << " H=" << H << " path=" << path;
  std::printf("moe n=%d E=%d H=%d I=%d path=%d: rel err %.3g\n", n, E, H, I, path, e);
}

TEST_F(Kernels, MoeMxfp4) {
  std::vector<MoeCase> cases = {{1, 128, 4, 2880, 2880}, {33, 128, 4, 2880, 2880}, {129, 32, 4, 2880, 2880},
                                {2049, 32, 4, 256, 256}, {7, 8, 2, 64, 64}};
  if (small_mode()) cases = {{1, 8, 2, 64, 64}, {33, 8, 4, 96, 64}};
  for (auto& c : cases)
    for (int path : {0, 1, 2}) check_moe(c, path);
}

// The MoE block through expert GEMM version 2 (GEMM path, checkpoint MXFP4 layout).
TEST_F(Kernels, MoeMxfp4ExpertGemmV2) {
  std::vector<MoeCase> cases = {{1, 128, 4, 2880, 2880}, {33, 128, 4, 2880, 2880}, {129, 32, 4, 2880, 2880},
                                {2049, 32, 4, 256, 256}, {7, 8, 2, 64, 64}};
  if (small_mode()) cases = {{1, 8, 2, 64, 64}, {33, 8, 4, 128, 64}};
  cuda::set_expert_gemm_version(2);
  for (auto& c : cases)
    for (int path : {2, 3})  // checkpoint layout; fragment layout (past 64 tokens: below, the skinny kernels)
      if (path == 2 || c.n > cuda::kSkinnyMaxTokens) check_moe(c, path);
}

// The MoE block through expert GEMM version 3 (Hopper wgmma), both layouts, 64-row tiles (one
// warpgroup a CTA) and 128-row tiles (two sharing the decoded weights); skipped elsewhere.
TEST_F(Kernels, MoeMxfp4ExpertGemmV3) {
  if (!cuda::expert_gemm_v3_available()) GTEST_SKIP() << "expert GEMM v3 needs sm_90a (Hopper)";
  std::vector<MoeCase> cases = {{1, 128, 4, 2880, 2880}, {33, 128, 4, 2880, 2880}, {129, 32, 4, 2880, 2880},
                                {2049, 32, 4, 256, 256}, {7, 8, 2, 64, 64}};
  if (small_mode()) cases = {{1, 8, 2, 64, 64}, {33, 8, 4, 128, 64}};
  cuda::set_expert_gemm_version(3);
  for (int tile_rows : {64, 128}) {
    cuda::set_expert_gemm_v3_tile_rows(tile_rows);
    SCOPED_TRACE("v3 tile rows " + std::to_string(tile_rows));
    for (auto& c : cases)
      for (int path : {2, 3})
        if (path == 2 || c.n > cuda::kSkinnyMaxTokens) check_moe(c, path);
  }
  cuda::set_expert_gemm_v3_tile_rows(-1);
  cuda::set_expert_gemm_version(0);
}

// Version 5 (weights as wgmma's register A, activations stored in the fragment K order) on the
// fragment layout at real and awkward shapes, against the CPU.
TEST_F(Kernels, MoeMxfp4ExpertGemmV5) {
  if (!cuda::expert_gemm_v3_available()) GTEST_SKIP() << "expert GEMM v5 needs sm_90a (Hopper)";
  std::vector<MoeCase> cases = {{1, 128, 4, 2880, 2880}, {33, 128, 4, 2880, 2880}, {129, 32, 4, 2880, 2880},
                                {2049, 32, 4, 256, 256},  {600, 128, 4, 2880, 2880}, {7, 8, 2, 64, 64}};
  if (small_mode()) cases = {{1, 8, 2, 64, 64}, {33, 8, 4, 128, 64}, {100, 8, 4, 64, 128}};
  cuda::set_expert_gemm_version(5);
  for (int wgs : {2, 4})  // CTAs of 128 and of 256 weight rows
    for (int pairs : {32, 48, 64, 80, 96, 128})
      for (int mbar : {1, 0}) {  // permuted activations handed over by mbarriers (128 pairs), or a block barrier
        if (mbar && (pairs != 128 || wgs != 4)) continue;  // (the others always take the block barrier)
        cuda::set_expert_gemm_v5_warpgroups(wgs);
        cuda::set_expert_gemm_v5_tile_pairs(pairs);
        cuda::set_expert_gemm_v5_mbarriers(mbar);
        SCOPED_TRACE("v5 tile pairs " + std::to_string(pairs) + ", " + std::to_string(wgs) + " warpgroups, " +
                     (mbar ? "mbarriers" : "block barrier"));
        for (auto& c : cases)
          if (c.n > cuda::kSkinnyMaxTokens)
            for (int path : {3, 4})  // transposed in the kernel (block barrier always); handed over permuted
              if (path == 4 || !mbar) check_moe(c, path);
      }
  cuda::set_expert_gemm_v5_mbarriers(-1);
  cuda::set_expert_gemm_v5_warpgroups(-1);
  cuda::set_expert_gemm_v5_tile_pairs(-1);
  // Split tilings (whole tiles of `bulk` pairs, remainders of at most `rem` in a second launch),
  // forced, each CTA shape as the automatic rules pick it: groups wholly in the remainder launch,
  // wholly in the bulk one, and cut between them (2049 tokens over 32 experts: ~256 pairs each,
  // bulk 128 on four warpgroups with mbarriers).
  for (const auto& [bulk, rem] : {std::pair{48, 32}, {128, 32}, {128, 96}, {80, 64}}) {
    cuda::set_expert_gemm_v5_split(bulk, rem);
    SCOPED_TRACE("v5 split tiling " + std::to_string(bulk) + " + " + std::to_string(rem));
    EXPECT_EQ(cuda::expert_gemm_v5_tiling(4096, 128).rem, rem);
    for (auto& c : cases)
      if (c.n > cuda::kSkinnyMaxTokens) check_moe(c, 4);
  }
  cuda::set_expert_gemm_v5_split(-1, 0);
  cuda::set_expert_gemm_version(0);
}

// Version 5's automatic split tiling (host only): by the tile cost model, 120b's experts at 4096
// tokens (~128 pairs each) in 128-pair tiles with the remainders of up to 32 pairs in a second
// launch (s37r3: gate_up + down 2523 -> 2400 us); one width, the one expert_gemm_v5_auto_tile_pairs
// picks, where the bulk would not be the 128-pair mbarrier kernel (120b at 512 and 2048 tokens:
// 80 + 64 measured 4% slower than 80) or the split saves under 2% (20b at 16384 tokens).
TEST(ExpertGemmV5Width, SplitsWhereTheModelSavesTiles) {
  cuda::set_expert_gemm_v5_split(-1, 0);
  cuda::set_expert_gemm_v5_tile_pairs(0);
  const auto t4096 = cuda::expert_gemm_v5_auto_tiling(4 * 4096, 128);
  EXPECT_EQ(t4096.bulk, 128);
  EXPECT_EQ(t4096.rem, 32);
  for (const auto& [tokens, experts] : {std::pair{512, 128}, {2048, 128}, {1024, 32}, {16384, 32}}) {
    const auto t = cuda::expert_gemm_v5_auto_tiling(4 * tokens, experts);
    EXPECT_EQ(t.rem, 0) << tokens << " tokens over " << experts << " experts";
    EXPECT_EQ(t.bulk, cuda::expert_gemm_v5_auto_tile_pairs(4 * tokens, experts));
  }
  cuda::set_expert_gemm_v5_tile_pairs(-1);
}

// Version 5's automatic tile width (host only): the width bench-kernels measured fastest on the
// H200 at these sizes (s14r1-r3; gate_up + down with k-permuted activations), where the experts
// average 8-1024 pairs. A changed cost model must still pick these.
TEST(ExpertGemmV5Width, PicksTheWidthMeasuredFastest) {
  struct Case {
    int tokens, experts, width;
  };
  const Case cases[] = {{256, 128, 32}, {512, 128, 32}, {1024, 128, 48}, {2048, 128, 80}, {4096, 128, 80},
                        {8192, 128, 96}, {256, 32, 48},  {512, 32, 80},   {1024, 32, 80},  {2048, 32, 96},
                        {4096, 32, 128}};
  cuda::set_expert_gemm_v5_mbarriers(0);  // 128-pair tiles behind the block barrier, as measured then
  for (int pass = 0; pass < 2; ++pass)  // the second pass answers from the per-thread cache
    for (const Case& c : cases)
      EXPECT_EQ(cuda::expert_gemm_v5_auto_tile_pairs(4 * c.tokens, c.experts), c.width)
          << c.tokens << " tokens over " << c.experts << " experts, pass " << pass;
  // With the mbarrier hand-off (four warpgroups: launches of 8192 pairs and up) a 128-pair tile
  // costs less (s25r2: 1.37-1.41x a 64-pair tile against 1.49-1.51x), so experts of ~128-1024
  // pairs take it (s25r2: 120b at 8192 tokens 4682 -> 4363 us, 20b at 2048 1107 -> 1086); 120b at
  // 2048 tokens keeps 80 (1396 against 1642), and 20b at 1024 (two warpgroups) 80 (s25r3: 128 lost 3.5%).
  cuda::set_expert_gemm_v5_mbarriers(1);
  const Case mbar_cases[] = {{2048, 128, 80}, {4096, 128, 128}, {8192, 128, 128}, {1024, 32, 80}, {2048, 32, 128},
                             {512, 128, 32},  {512, 32, 80}};
  for (int pass = 0; pass < 2; ++pass)
    for (const Case& c : mbar_cases)
      EXPECT_EQ(cuda::expert_gemm_v5_auto_tile_pairs(4 * c.tokens, c.experts), c.width)
          << c.tokens << " tokens over " << c.experts << " experts with mbarriers, pass " << pass;
  cuda::set_expert_gemm_v5_mbarriers(-1);
  // A few pairs over many experts: the narrowest; nothing to do, or no experts: 64.
  EXPECT_EQ(cuda::expert_gemm_v5_auto_tile_pairs(40, 128), 32);
  EXPECT_EQ(cuda::expert_gemm_v5_auto_tile_pairs(0, 128), 64);
  EXPECT_EQ(cuda::expert_gemm_v5_auto_tile_pairs(100, 0), 64);
}

// The automatic prefill GEMM choice: version 5 at every size it takes (s13r1: faster than version
// 3 from 16 to 256 pairs an expert), nothing for an empty pass.
// Version 5's automatic CTA shape (host only): four warpgroups where the H200 measured them faster
// (s24r1-r2: tiles of 64 pairs and up, launches of 8192 pairs and up), two elsewhere.
TEST(ExpertGemmV5Warpgroups, FourOnlyWhereMeasuredFaster) {
  EXPECT_EQ(cuda::expert_gemm_v5_auto_warpgroups(96, 32768), 4);  // 120b and 20b at 8192 tokens
  EXPECT_EQ(cuda::expert_gemm_v5_auto_warpgroups(80, 8192), 4);   // 120b at 2048
  EXPECT_EQ(cuda::expert_gemm_v5_auto_warpgroups(64, 8192), 4);
  EXPECT_EQ(cuda::expert_gemm_v5_auto_warpgroups(48, 32768), 2);  // narrow tiles lost
  EXPECT_EQ(cuda::expert_gemm_v5_auto_warpgroups(32, 8192), 2);
  EXPECT_EQ(cuda::expert_gemm_v5_auto_warpgroups(80, 2048), 2);   // 20b at 512 tokens lost 1.9%
  EXPECT_EQ(cuda::expert_gemm_v5_auto_warpgroups(128, 4096), 2);  // 20b at 1024 lost 1.6%
}

TEST_F(Kernels, ExpertGemmV5Preferred) {
  EXPECT_TRUE(cuda::expert_gemm_v5_preferred(2048 * 4, 128));
  EXPECT_TRUE(cuda::expert_gemm_v5_preferred(512 * 4, 32));
  EXPECT_TRUE(cuda::expert_gemm_v5_preferred(2048 * 4, 32));   // 20b prefill: 256 pairs an expert
  EXPECT_TRUE(cuda::expert_gemm_v5_preferred(4096 * 4, 128));
  EXPECT_TRUE(cuda::expert_gemm_v5_preferred(65, 128));  // 65 experts of one pair each
  EXPECT_FALSE(cuda::expert_gemm_v5_preferred(0, 128));
}

// Version 3's tile height rule: 128-row tiles once the experts average 48 pairs or more (120b and
// 20b at 2048 tokens), 64-row ones below; GPTOSS_EXPERT_GEMM_TILE_M's values only.
TEST_F(Kernels, ExpertGemmV3TileRows) {
  // 64-row tiles by default at every size (128-row tiles measured slower on the H200).
  EXPECT_EQ(cuda::expert_gemm_v3_auto_tile_rows(2048 * 4, 128), 64);
  EXPECT_EQ(cuda::expert_gemm_v3_auto_tile_rows(2048 * 4, 32), 64);
  EXPECT_EQ(cuda::expert_gemm_v3_auto_tile_rows(512 * 4, 128), 64);
  EXPECT_THROW(cuda::set_expert_gemm_v3_tile_rows(96), Error);
  cuda::set_expert_gemm_v3_tile_rows(128);
  EXPECT_EQ(cuda::expert_gemm_v3_tile_rows(), 128);
  cuda::set_expert_gemm_v3_tile_rows(0);
  EXPECT_EQ(cuda::expert_gemm_v3_tile_rows(), 0);
  cuda::set_expert_gemm_v3_tile_rows(-1);
}

// Version 3's shared-memory layout and wgmma descriptors on one dense tile, C = A . B^T with A
// [64][K], B [128][K]. First exact probes that say which element landed where: A the identity
// (K = 64) and B[n][k] = n, then = k, so C[m][n] must be n, then m; a wrong value names the B
// row (or the A row / K position) the hardware read instead. Then random K = 256 (four steps).
TEST_F(Kernels, WgmmaDenseTileLayout) {
  if (!cuda::expert_gemm_v3_available()) GTEST_SKIP() << "wgmma needs sm_90a (Hopper)";
  const int M = 64, N = 128;
  auto run = [&](const std::vector<float>& a, const std::vector<float>& b, int K) {
    Dev<uint16_t> da(to_bf16(a)), db(to_bf16(b));
    Dev<float> dc(std::vector<float>(size_t(M) * N, std::nanf("")));
    cuda::wgmma_dense_tile_selfcheck(da.p(), db.p(), dc.p(), K, 0);
    return dc.download();
  };
  std::vector<float> eye(size_t(M) * 64, 0.f);
  for (int m = 0; m < M; ++m) eye[size_t(m) * 64 + m] = 1.f;
  for (int probe = 0; probe < 2; ++probe) {
    std::vector<float> b(size_t(N) * 64);
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < 64; ++k) b[size_t(n) * 64 + k] = float(probe == 0 ? n : k);
    const auto c = run(eye, b, 64);
    int bad = 0;
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        const float want = float(probe == 0 ? n : m);
        if (c[size_t(m) * N + n] != want && ++bad <= 8)
          ADD_FAILURE() << "C[" << m << "][" << n << "] = " << c[size_t(m) * N + n] << ", want " << want
                        << (probe == 0 ? " (the value is the B row read)" : " (the value is the K position of A's one)");
      }
    EXPECT_EQ(bad, 0) << "probe " << probe;
  }
  FastRng r(fresh_seed());
  const int K = 256;
  auto a = round_bf16(rand_f32(size_t(M) * K, r)), b = round_bf16(rand_f32(size_t(N) * K, r));
  const auto c = run(a, b, K);
  std::vector<float> ref(size_t(M) * N);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double acc = 0;
      for (int k = 0; k < K; ++k) acc += double(a[size_t(m) * K + k]) * b[size_t(n) * K + k];
      ref[size_t(m) * N + n] = float(acc);
    }
  EXPECT_LE(rel_err(c, ref), 1e-5);
}

// Routing built on the host with prescribed pairs per expert (0, 1, 63, 64, 65, 2048, ...): the
// groups, GEMM row tiles (kGemmBM) and pair tokens moe_route would produce for such a batch.
struct HostRouting {
  Dev<uint8_t> mem;
  cuda::MoeRouting r;
  std::vector<int> start, pair_token;
  std::vector<float> pair_weight;
};

HostRouting make_routing(const std::vector<int>& counts, int n_tokens, FastRng& rng) {
  const int E = int(counts.size());
  const int P = std::accumulate(counts.begin(), counts.end(), 0);
  std::vector<uint8_t> host(cuda::moe_routing_bytes(P, E), 0);
  HostRouting h;
  h.mem = Dev<uint8_t>(host.size());
  h.r = cuda::moe_routing_carve(h.mem.p(), P, E);
  cuda::MoeRouting hr = cuda::moe_routing_carve(host.data(), P, E);
  int g = 0, t = 0, off = 0;
  for (int e = 0; e < E; ++e) {
    h.start.push_back(off);
    const int c = counts[e];
    if (c == 0) continue;
    hr.group_expert[g] = e;
    hr.group_start[g] = off;
    hr.group_end[g] = off + c;
    for (int i = 0; i * cuda::kGemmBM < c; ++i, ++t) {
      hr.tile_group[t] = g;
      hr.tile_row[t] = off + i * cuda::kGemmBM;
    }
    ++g;
    off += c;
  }
  h.start.push_back(off);
  hr.counts[0] = g;
  hr.counts[1] = t;
  h.pair_token.resize(P);
  h.pair_weight.resize(P);
  for (int p = 0; p < P; ++p) {
    h.pair_token[p] = hr.pair_token[p] = int(rng.next() % uint64_t(n_tokens));
    h.pair_weight[p] = hr.pair_weight[p] = rng.uniform();
  }
  h.mem.upload(host);
  return h;
}

// gate_up (SwiGLU epilogue, gathered token rows) and down (f32 store; scatter-add) of both expert
// GEMM versions, on the checkpoint layout and the fragment layout, against the CPU's exact MXFP4
// decode, checked expert by expert so that one wrong
// group cannot hide in the total. down's reference takes the GPU's own SwiGLU output as input.
void check_expert_gemm(const std::vector<int>& counts, int n_tokens, int H, int I) {
  FastRng r(fresh_seed());
  const int E = int(counts.size());
  HostRouting rt = make_routing(counts, n_tokens, r);
  const int P = rt.start.back();
  // Scales on both sides of 2^1 (e8m0 128): version 1 splits them there.
  auto gu_b = rand_bytes(r, size_t(E) * 2 * I * H / 2, 0, 255), gu_s = rand_bytes(r, size_t(E) * 2 * I * H / 32, 116, 130);
  auto dn_b = rand_bytes(r, size_t(E) * H * I / 2, 0, 255), dn_s = rand_bytes(r, size_t(E) * H * I / 32, 116, 130);
  auto gu_bias = rand_f32(size_t(E) * 2 * I, r, 0.1f), dn_bias = rand_f32(size_t(E) * H, r, 0.1f);
  auto x = round_bf16(rand_f32(size_t(n_tokens) * H, r, 0.05f));
  Dev<uint16_t> dx(to_bf16(x));
  Dev<float> dgub(gu_bias), ddnb(dn_bias);
  Dev<uint8_t> dgu_b(gu_b), dgu_s(gu_s), ddn_b(dn_b), ddn_s(dn_s);
  WeightMat gu{WeightMat::kMXFP4, dgu_b.p(), dgu_s.p(), dgub.p(), 2 * I, H};
  WeightMat dn{WeightMat::kMXFP4, ddn_b.p(), ddn_s.p(), ddnb.p(), H, I};
  ASSERT_TRUE(cuda::expert_gemm_v2_supports(gu, dx.p(), H, n_tokens, Epilogue{Epilogue::kSwiGLU, nullptr, I}));

  // gate_up reference (the GPU result is checked per version below).
  std::vector<float> act_ref(size_t(P) * I);
  for (int e = 0; e < E; ++e) {
    const int p0 = rt.start[e], m = rt.start[e + 1] - p0;
    if (m == 0) continue;
    std::vector<float> xs(size_t(m) * H), g(size_t(m) * 2 * I);
    for (int i = 0; i < m; ++i) std::copy_n(&x[size_t(rt.pair_token[p0 + i]) * H], H, &xs[size_t(i) * H]);
    cpu::linear_mxfp4(xs.data(), m, H, &gu_b[size_t(e) * 2 * I * H / 2], &gu_s[size_t(e) * 2 * I * H / 32], 2 * I,
                      &gu_bias[size_t(e) * 2 * I], g.data());
    cpu::swiglu(g.data(), m, I, 7.f, &act_ref[size_t(p0) * I]);
  }
  auto rows = [](const std::vector<float>& v, int p0, int m, int w) {
    return std::vector<float>(v.begin() + size_t(p0) * w, v.begin() + size_t(p0 + m) * w);
  };
  // The same experts in the fragment layout (gate/up rows paired), as the backend repacks them.
  Dev<uint8_t> fgu(cuda::frag_weight_bytes(WeightMat::kFragMXFP4, E, 2 * I, H)), fgus(gu_s.size());
  Dev<uint8_t> fdn(cuda::frag_weight_bytes(WeightMat::kFragMXFP4, E, H, I)), fdns(dn_s.size());
  Dev<int> flag(std::vector<int>{0});
  const WeightMat pgu = cuda::pack_frag(gu, E, true, WeightMat::kFragMXFP4, fgu.p(), fgus.p(), flag.p(), 0);
  const WeightMat pdn = cuda::pack_frag(dn, E, false, WeightMat::kFragMXFP4, fdn.p(), fdns.p(), flag.p(), 0);
  ASSERT_EQ(flag.download()[0], 0);
  ASSERT_TRUE(cuda::expert_gemm_v2_supports(pgu, dx.p(), H, n_tokens, Epilogue{Epilogue::kSwiGLU, nullptr, I}));
  cuda::set_linear_path(2);
  // Versions 1, 2 and (on Hopper) 3 with 64-row and with 128-row tiles, each on both layouts.
  struct Run {
    int version, tile_rows;
  };
  std::vector<Run> configs = {{1, 0}, {2, 0}};
  // Version 5 (32- to 128-pair tiles) takes the fragment layout only (the checkpoint layout
  // falls back to version 3).
  if (cuda::expert_gemm_v3_available()) configs.insert(configs.end(), {{3, 64}, {3, 128}, {5, 32}, {5, 48}, {5, 64}, {5, 80}, {5, 96}, {5, 128}});
  const int nc = int(configs.size());
  for (int run = 0; run < 2 * nc; ++run) {
    const int version = configs[run % nc].version, tile_rows = configs[run % nc].tile_rows;
    const bool frag = run >= nc;
    const WeightMat& gu_w = frag ? pgu : gu;
    const WeightMat& dn_w = frag ? pdn : dn;
    const std::string layout = std::string(frag ? "fragments" : "checkpoint") +
                               (tile_rows ? ", " + std::to_string(tile_rows) + "-row tiles" : "");
    cuda::set_expert_gemm_version(version);
    if (tile_rows && version == 5)
      cuda::set_expert_gemm_v5_tile_pairs(tile_rows);
    else if (tile_rows)
      cuda::set_expert_gemm_v3_tile_rows(tile_rows);
    Dev<uint16_t> act(size_t(P) * I);
    Dev<float> y(size_t(P) * H), out(std::vector<float>(size_t(n_tokens) * H, 0.f));
    cuda::linear_grouped(gu_w, dx.p(), H, P, E, true, rt.r, Epilogue{Epilogue::kSwiGLU, act.p(), I}, 0, n_tokens);
    cuda::linear_grouped(dn_w, act.p(), I, P, E, false, rt.r, Epilogue{Epilogue::kStoreF32, y.p(), H}, 0, n_tokens);
    cuda::linear_grouped(dn_w, act.p(), I, P, E, false, rt.r, Epilogue{Epilogue::kScatterAdd, out.p(), H}, 0,
                         n_tokens);
    const auto gact = from_bf16(act.download());
    const auto gy = y.download(), gout = out.download();
    std::vector<float> y_ref(size_t(P) * H), out_ref(size_t(n_tokens) * H, 0.f);
    double worst_act = 0, worst_y = 0;
    for (int e = 0; e < E; ++e) {
      const int p0 = rt.start[e], m = rt.start[e + 1] - p0;
      if (m == 0) continue;
      const double ea = rel_err(rows(gact, p0, m, I), rows(act_ref, p0, m, I));
      EXPECT_LE(ea, 8e-3) << "gate_up expert " << e << " (" << m << " pairs) v" << version << " " << layout;
      cpu::linear_mxfp4(&gact[size_t(p0) * I], m, I, &dn_b[size_t(e) * H * I / 2], &dn_s[size_t(e) * H * I / 32], H,
                        &dn_bias[size_t(e) * H], &y_ref[size_t(p0) * H]);
      const double ey = rel_err(rows(gy, p0, m, H), rows(y_ref, p0, m, H));
      EXPECT_LE(ey, 1e-3) << "down expert " << e << " (" << m << " pairs) v" << version << " " << layout;
      worst_act = std::max(worst_act, ea);
      worst_y = std::max(worst_y, ey);
    }
    for (int p = 0; p < P; ++p)
      for (int h = 0; h < H; ++h)
        out_ref[size_t(rt.pair_token[p]) * H + h] += rt.pair_weight[p] * y_ref[size_t(p) * H + h];
    EXPECT_LE(rel_err(gout, out_ref), 1e-3) << "scatter-add v" << version << " " << layout;
    std::printf("expert gemm v%d %s: %d pairs over %d experts, H=%d I=%d: worst rel err gate_up %.3g down %.3g\n",
                version, layout.c_str(), P, E, H, I, worst_act, worst_y);
  }
  cuda::set_expert_gemm_v3_tile_rows(-1);
  cuda::set_expert_gemm_v5_tile_pairs(-1);
  cuda::set_expert_gemm_version(0);
}

// Pairs per expert 0, 1, 63, 64, 65, 127-129, 192, 255-257 and 2048 at small widths (tail column
// tiles in both GEMMs; for 128-row tiles: a second warpgroup with no rows, one row, a full 64, a
// last tile of 64 rows); 120b/20b widths (2880) with 1..130 pairs per expert at expert indices up
// to 31; a single pair.
TEST_F(Kernels, ExpertGemmAwkwardGroups) {
  if (small_mode()) {
    check_expert_gemm({0, 1, 63, 64, 65, 0, 130, 2}, 200, 128, 64);
    return;
  }
  check_expert_gemm({0, 1, 63, 64, 65, 127, 2048, 0, 128, 129, 192, 255, 256, 257, 2048, 2048, 830, 0}, 2048, 320, 192);
  std::vector<int> real(32, 0);
  real[0] = 1, real[3] = 63, real[17] = 65, real[30] = 64, real[31] = 130;
  check_expert_gemm(real, 300, 2880, 2880);
  check_expert_gemm({0, 0, 1, 0}, 1, 2880, 2880);
}

// The fragment-layout path the backend runs by default, at every decode regime (1, 2, 7, 8, 33,
// 64 tokens over 128 experts: groups of 0, 1 and a few tokens; 64 tokens over 8 experts: groups of
// ~32, two n-tile passes) and past it (prefill sizes through the GEMM).
TEST_F(Kernels, MoeMxfp4Fragments) {
  std::vector<MoeCase> cases = {{1, 128, 4, 2880, 2880},  {2, 128, 4, 2880, 2880}, {7, 128, 4, 2880, 2880},
                                {8, 128, 4, 2880, 2880},  {33, 128, 4, 2880, 2880}, {64, 128, 4, 2880, 2880},
                                {64, 8, 4, 2880, 2880},   {17, 32, 4, 2880, 2880}, {129, 32, 4, 2880, 2880},
                                {2049, 32, 4, 256, 256},  {7, 8, 2, 64, 64}};
  if (small_mode()) cases = {{1, 8, 2, 64, 64}, {33, 8, 4, 64, 128}, {70, 8, 4, 64, 64}};
  for (int family : {0, 1}) {  // stream-K (<= 8 tokens an expert) and the block-per-tile skinny kernel
    cuda::set_decode_kernel_choice(family);
    for (auto& c : cases) check_moe(c, 3);
  }
}

// The one-n-tile decode shapes alone (1, 2 and 8 tokens at the real widths: compile-time chunk
// counts, activation rows staged before the routing is read), small enough for compute-sanitizer.
TEST_F(Kernels, MoeMxfp4FragmentsDecode) {
  cuda::set_decode_kernel_choice(1);
  for (int n : {1, 2, 8}) check_moe({n, 128, 4, 2880, 2880}, 3);
  // 20b at 56 and 64 tokens: mean groups of 7 and 8 tokens, which the default walks in 16-token passes.
  if (!small_mode())
    for (int n : {56, 64}) check_moe({n, 32, 4, 2880, 2880}, 3);
  // One rank's experts at TP=2 (the intermediate split 1472 + 1408: down's K).
  for (int n : {1, 8}) {
    check_moe({n, 128, 4, 2880, 1472}, 3);
    check_moe({n, 128, 4, 2880, 1408}, 3);
  }
}

// The unit-walking grouped kernel (a GPU-sized grid walking (group, pass, row-tile block) units)
// against the one-block-per-(group, row-tile block) kernel with the same K split (8 warps): the same sums in the
// same order, so equal bit for bit. 2, 8 and 33 tokens over 128 experts, 17 over 32, and 40
// over 128 with half the tokens on experts 0-3 (groups of ~22 tokens: three passes beside groups
// of one), 120b widths; gate_up (SwiGLU, gathered rows) and down (its routing settled: read
// before the wait), every unit-kernel shape.
TEST_F(Kernels, SkinnyUnitsKernelMatchesBlockPerTile) {
  struct Case {
    int n, E;
    bool skewed;
    int I = 2880;  // 1472, 1408: one rank's intermediate slice at TP=2
  };
  std::vector<Case> cases = {{2, 128, false},       {8, 128, false},       {33, 128, false}, {17, 32, false},
                             {40, 128, true},       {8, 128, false, 1472}, {33, 128, false, 1408},
                             {64, 32, false},       {48, 32, false}};  // 20b: ~8 tokens a group, many take two passes
  if (small_mode()) cases = {{8, 128, false}, {40, 128, true}, {64, 32, false}};
  const int H = 2880, k = 4;
  for (const Case& c : cases) {
    const int I = c.I;
    const uint64_t seed = fresh_seed();
    const int n = c.n, E = c.E, P = n * k;
    FastRng r(seed);
    const size_t gu_bytes = size_t(E) * 2 * I * H / 2, dn_bytes = size_t(E) * H * I / 2;
    Dev<uint8_t> gu_b(gu_bytes), gu_s(gu_bytes / 16), dn_b(dn_bytes), dn_s(dn_bytes / 16);
    cuda::fill_random_u8(gu_b.p(), gu_bytes, seed + 1, 0, 255, 0);
    cuda::fill_random_u8(gu_s.p(), gu_bytes / 16, seed + 2, 118, 121, 0);
    cuda::fill_random_u8(dn_b.p(), dn_bytes, seed + 3, 0, 255, 0);
    cuda::fill_random_u8(dn_s.p(), dn_bytes / 16, seed + 4, 118, 121, 0);
    Dev<float> gub(rand_f32(size_t(E) * 2 * I, r, 0.1f)), dnb(rand_f32(size_t(E) * H, r, 0.1f));
    auto hl = rand_f32(size_t(n) * E, r);
    if (c.skewed)
      for (int tok = 0; tok < n; tok += 2)
        for (int e = 0; e < 4; ++e) hl[size_t(tok) * E + e] += 10.f;
    Dev<float> logits(hl);
    Dev<uint16_t> x(to_bf16(round_bf16(rand_f32(size_t(n) * H, r))));
    Dev<uint8_t> fgu(gu_bytes), fgus(gu_bytes / 16), fdn(dn_bytes), fdns(dn_bytes / 16);
    Dev<int> flag(std::vector<int>{0});
    const WeightMat gu{WeightMat::kMXFP4, gu_b.p(), gu_s.p(), gub.p(), 2 * I, H};
    const WeightMat dn{WeightMat::kMXFP4, dn_b.p(), dn_s.p(), dnb.p(), H, I};
    const WeightMat pgu = cuda::pack_frag(gu, E, true, WeightMat::kFragMXFP4, fgu.p(), fgus.p(), flag.p(), 0);
    const WeightMat pdn = cuda::pack_frag(dn, E, false, WeightMat::kFragMXFP4, fdn.p(), fdns.p(), flag.p(), 0);
    Dev<uint8_t> rmem(cuda::moe_routing_bytes(P, E));
    cuda::MoeRouting rt = cuda::moe_routing_carve(rmem.p(), P, E);
    cuda::moe_route(logits.p(), n, E, k, rt, 0);
    cuda::MoeRouting settled = rt;
    settled.settled = true;
    auto run = [&](int variant, Dev<uint16_t>& act, Dev<float>& y, const Dev<uint16_t>& act_in) {
      cuda::set_skinny_variant(variant);
      Epilogue ge{Epilogue::kSwiGLU, act.p(), I};
      ge.out_f16 = true;
      cuda::skinny_linear(pgu, x.p(), false, H, n, P, E, true, true, rt, ge, 8, 0);
      cuda::skinny_linear(pdn, act_in.p(), true, I, n, P, E, true, false, settled, Epilogue{Epilogue::kStoreF32, y.p(), H},
                          8, 0);
      GPTOSS_CUDA_CHECK(cudaDeviceSynchronize());
    };
    // Reference 10: ks8 rt4 pf1 of skinny_mma_kernel, for the K-split unit shapes (11-19);
    // reference 20: ks1 rt1 pf4 (a warp over all of K), for the warp-per-tile walks (21-).
    for (int ref : {10, 20}) {
      Dev<uint16_t> act_ref(size_t(P) * I);
      Dev<float> y_ref(size_t(P) * H);
      run(ref, act_ref, y_ref, act_ref);  // down reads gate_up's output
      const auto a_ref = act_ref.download();
      const auto yr = y_ref.download();
      for (int v = ref + 1; v < (ref == 10 ? 20 : cuda::kSkinnyVariants); ++v) {
        Dev<uint16_t> act(size_t(P) * I);
        Dev<float> y(size_t(P) * H);
        run(v, act, y, act_ref);
        EXPECT_TRUE(act.download() == a_ref) << "gate_up, " << cuda::skinny_variant_name(v) << ", n=" << n << " E=" << E << " I=" << I;
        EXPECT_TRUE(y.download() == yr) << "down, " << cuda::skinny_variant_name(v) << ", n=" << n << " E=" << E << " I=" << I;
      }
      if (ref == 20) {  // the two K orders agree to rounding
        Dev<uint16_t> act10(size_t(P) * I);
        Dev<float> y10(size_t(P) * H);
        run(10, act10, y10, act_ref);
        EXPECT_LE(rel_err(y10.download(), yr), 1e-5) << "n=" << n << " E=" << E << " I=" << I;
      }
    }
    cuda::set_skinny_variant(0);
    EXPECT_EQ(flag.download()[0], 0);
  }
}

// The warp top-k every decode router shares (route_sort.cuh): its shuffle-merge form (k <= 4)
// selects exactly what the round-by-round form selects, expert and value bits, on rows full of
// ties, zero keys (none / NaN) and rows with fewer than k nonzero keys (where both give expert 0),
// and on rows of distinct random keys, at 8-256 experts and k = 1-4.
TEST_F(Kernels, WarpTopKMergeEqualsRounds) {
  for (int E : {8, 32, 100, 128, 256})
    for (int k = 1; k <= 4; ++k) {
      FastRng r(fresh_seed());
      const int rows = 64;
      std::vector<uint32_t> keys(size_t(rows) * E);
      for (int row = 0; row < rows; ++row)
        for (int e = 0; e < E; ++e) {
          uint32_t& key = keys[size_t(row) * E + e];
          const int kind = row % 4;
          if (kind == 0)
            key = uint32_t(r.next());  // distinct (almost surely)
          else if (kind == 1)
            key = 0x80000000u + uint32_t(r.next() % 3);  // few values: ties everywhere
          else if (kind == 2)
            key = r.next() % 4 == 0 ? 0u : 0x3f000000u + uint32_t(r.next() % 2);  // zeros among ties
          else
            key = e == E - 1 - row % E || e == row % E ? 0x90000000u : 0u;  // at most two nonzero
        }
      Dev<uint32_t> dk(keys);
      Dev<int> e_merge(size_t(rows) * k), e_rounds(size_t(rows) * k);
      Dev<float> v_merge(size_t(rows) * k), v_rounds(size_t(rows) * k);
      cuda::warp_top_k_probe(dk.p(), rows, E, k, true, e_merge.p(), v_merge.p());
      cuda::warp_top_k_probe(dk.p(), rows, E, k, false, e_rounds.p(), v_rounds.p());
      GPTOSS_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(e_merge.download(), e_rounds.download()) << "E=" << E << " k=" << k;
      const auto vm = v_merge.download(), vr = v_rounds.download();
      EXPECT_EQ(0, std::memcmp(vm.data(), vr.data(), vm.size() * 4)) << "E=" << E << " k=" << k;
      // (and the rounds' own answer on a distinct row, against the host)
      std::vector<int> order(E);
      for (int e = 0; e < E; ++e) order[e] = e;
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return keys[a] > keys[b]; });
      const auto er = e_rounds.download();
      for (int j = 0; j < k; ++j) EXPECT_EQ(er[j], order[j]) << "E=" << E << " k=" << k << " j=" << j;
    }
}

// Exact router ties go to the lower expert index on the device too (as cpu::router_topk and
// torch.topk in transformers): tie blocks on and across the top-k boundary, for the small-batch
// kernel (n <= 64) and the large one, at the tiny, 20b and 120b expert counts.
TEST_F(Kernels, MoeRouteTiesGoToTheLowerIndex) {
  for (int E : {8, 32, 128})
    for (int k : {2, 4})
      for (int n : {5, 100}) {
        FastRng r(fresh_seed());
        std::vector<float> logits(size_t(n) * E);
        for (int t = 0; t < n; ++t)
          for (int e = 0; e < E; ++e)  // few distinct values: ties everywhere
            logits[size_t(t) * E + e] = float(int(r.next() % 4)) * 0.5f;
        std::vector<int32_t> idx(size_t(n) * k);
        std::vector<float> wts(size_t(n) * k);
        cpu::router_topk(logits.data(), n, E, k, idx.data(), wts.data());
        Dev<float> dlog(logits);
        Dev<uint8_t> rmem(cuda::moe_routing_bytes(n * k, E));
        auto rt = cuda::moe_routing_carve(rmem.p(), n * k, E);
        cuda::moe_route(dlog.p(), n, E, k, rt, 0);
        GPTOSS_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<int32_t> gidx(size_t(n) * k);
        GPTOSS_CUDA_CHECK(cudaMemcpy(gidx.data(), rt.topk_idx, gidx.size() * 4, cudaMemcpyDeviceToHost));
        EXPECT_EQ(gidx, idx) << "E=" << E << " k=" << k << " n=" << n;
      }
}

// moe_combine past decode sizes (a block per token) against its decode-size kernel (clusters, kept
// at every size in batch-invariant mode) and the CPU: the residual update is the same sum in the
// same order (bit for bit), the next layer's normalized rows within bf16 rounding.
TEST_F(Kernels, MoeCombineRowsMatchClusters) {
  const int H = small_mode() ? 96 : 2880, E = 32, k = 4;
  for (int n : {65, 300, small_mode() ? 129 : 2049}) {
    FastRng r(fresh_seed());
    const int P = n * k;
    auto logits = rand_f32(size_t(n) * E, r);
    auto y = rand_f32(size_t(P) * H, r);
    auto x = rand_f32(size_t(n) * H, r, 2.f);
    auto nw = rand_f32(H, r, 0.1f, 1.f);
    Dev<float> dlog(logits), dy(y), dnw(nw), xa(x), xb(x);
    Dev<uint16_t> xna(size_t(n) * H), xnb(size_t(n) * H);
    Dev<uint8_t> rmem(cuda::moe_routing_bytes(P, E));
    auto rt = cuda::moe_routing_carve(rmem.p(), P, E);
    cuda::moe_route(dlog.p(), n, E, k, rt, 0);
    cuda::moe_combine(dy.p(), rt, n, k, H, xa.p(), dnw.p(), 1e-5f, xna.p(), 0, false);
    cuda::moe_combine(dy.p(), rt, n, k, H, xb.p(), dnw.p(), 1e-5f, xnb.p(), 0, true);
    GPTOSS_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(xa.download(), xb.download()) << "n=" << n;
    EXPECT_LE(rel_err(from_bf16(xna.download()), from_bf16(xnb.download())), 5e-3) << "n=" << n;
    // The CPU: x + sum_j w_j y[slot], then rmsnorm.
    std::vector<int32_t> slot(P);
    std::vector<float> w(P);
    GPTOSS_CUDA_CHECK(cudaMemcpy(slot.data(), rt.slot_pair, P * 4, cudaMemcpyDeviceToHost));
    GPTOSS_CUDA_CHECK(cudaMemcpy(w.data(), rt.topk_w, P * 4, cudaMemcpyDeviceToHost));
    std::vector<float> ref = x, xn(x.size());
    for (int t = 0; t < n; ++t)
      for (int h = 0; h < H; ++h) {
        float sum = 0.f;
        for (int j = 0; j < k; ++j) sum += w[t * k + j] * y[size_t(slot[t * k + j]) * H + h];
        ref[size_t(t) * H + h] += sum;
      }
    cpu::rmsnorm(ref.data(), nw.data(), n, H, 1e-5f, xn.data());
    EXPECT_LE(rel_err(xa.download(), ref), 1e-5) << "n=" << n;
    EXPECT_LE(rel_err(from_bf16(xna.download()), xn), 5e-3) << "n=" << n;
  }
}

// The decode router (norm + GEMV + top-k + sort in one launch) against the CPU norm and GEMV, and
// its routing against moe_route over the same logits, launch after launch (the ticket resets).
struct RouterCase {
  int n, E, K, k, eb, ee;
};

// Runs moe_router_route under router variant `variant` (kernels.h) and checks it; returns the
// logits (empty if the variant does not take the shape). ties: zero router rows and biases from
// {0, 0.5, 1}, so every logit ties with many others (the lower expert index must win).
std::vector<float> check_router_route(const RouterCase& c, bool f16, bool ties, int variant, uint64_t seed) {
  cuda::set_router_variant(variant);
  if (!cuda::router_route_fuses(c.n, c.K, c.E, c.k)) return {};
  FastRng r(seed);
  auto x = rand_f32(size_t(c.n) * c.K, r, 3.f);
  auto nw = rand_f32(c.K, r, 0.1f, 1.f);
  auto wf = rand_f32(size_t(c.E) * c.K, r, 0.02f);
  auto bias = rand_f32(c.E, r, 0.1f);
  if (ties) {
    std::fill(wf.begin(), wf.end(), 0.f);
    for (auto& b : bias) b = float(int(r.next() % 3)) * 0.5f;
  }
  auto wb = to_bf16(wf);
  std::vector<float> xn(x.size()), ref(size_t(c.n) * c.E);
  cpu::rmsnorm(x.data(), nw.data(), c.n, c.K, 1e-5f, xn.data());
  xn = round_bf16(xn);
  cpu::linear_bf16(xn.data(), c.n, c.K, wb.data(), c.E, bias.data(), ref.data());
  Dev<float> dx(x), dnw(nw), db(bias), dlog(ref.size()), dlog2(ref.size());
  Dev<uint16_t> dw(wb), dxn(std::vector<uint16_t>(x.size(), 0x7fc0));
  Dev<int> ticket(std::vector<int>{0});
  const int P = c.n * c.k;
  Dev<uint8_t> rmem(cuda::moe_routing_bytes(P, c.E)), rmem2(cuda::moe_routing_bytes(P, c.E));
  auto rt = cuda::moe_routing_carve(rmem.p(), P, c.E), rt2 = cuda::moe_routing_carve(rmem2.p(), P, c.E);
  for (int rep = 0; rep < 2; ++rep)
    cuda::moe_router_route(reinterpret_cast<const cuda::bf16_t*>(dw.p()), db.p(), c.E, c.K, dx.p(), dnw.p(), 1e-5f,
                           c.n, dxn.p(), f16, dlog.p(), c.k, rt, ticket.p(), 0, c.eb, c.ee);
  GPTOSS_CUDA_CHECK(cudaDeviceSynchronize());
  const std::string at = "n=" + std::to_string(c.n) + " E=" + std::to_string(c.E) + " K=" + std::to_string(c.K) +
                         " k=" + std::to_string(c.k) + " f16=" + std::to_string(f16) + " ties=" + std::to_string(ties) +
                         " variant=" + cuda::router_variant_name(variant);
  auto logits = dlog.download();
  EXPECT_LE(rel_err(logits, ref), 2e-3) << at;
  if (ties) {
    std::vector<float> b;
    for (int t = 0; t < c.n; ++t) b.insert(b.end(), bias.begin(), bias.end());
    EXPECT_EQ(logits, b) << at << ": zero rows give the bias exactly";
  }
  EXPECT_EQ(ticket.download()[0], 0) << at;
  auto gxn = dxn.download();
  std::vector<float> xn_got(gxn.size());
  for (size_t i = 0; i < gxn.size(); ++i) xn_got[i] = f16 ? f16_to_f32(gxn[i]) : bf16_to_f32(gxn[i]);
  EXPECT_LE(rel_err(xn_got, xn), 5e-3) << at;
  // Same logits through moe_route: every routing array must agree exactly.
  dlog2.upload(logits);
  cuda::moe_route(dlog2.p(), c.n, c.E, c.k, rt2, 0, c.eb, c.ee);
  GPTOSS_CUDA_CHECK(cudaDeviceSynchronize());
  auto ints = [&](const int32_t* p, size_t count) {
    std::vector<int32_t> v(count);
    GPTOSS_CUDA_CHECK(cudaMemcpy(v.data(), p, count * 4, cudaMemcpyDeviceToHost));
    return v;
  };
  auto floats = [&](const float* p, size_t count) {
    std::vector<float> v(count);
    GPTOSS_CUDA_CHECK(cudaMemcpy(v.data(), p, count * 4, cudaMemcpyDeviceToHost));
    return v;
  };
  EXPECT_EQ(ints(rt.counts, 2), ints(rt2.counts, 2)) << at;
  const int groups = ints(rt2.counts, 1)[0];
  EXPECT_EQ(ints(rt.group_expert, groups), ints(rt2.group_expert, groups)) << at;
  EXPECT_EQ(ints(rt.group_start, groups), ints(rt2.group_start, groups)) << at;
  EXPECT_EQ(ints(rt.group_end, groups), ints(rt2.group_end, groups)) << at;
  const int tiles = ints(rt2.counts, 2)[1];
  EXPECT_EQ(ints(rt.tile_group, tiles), ints(rt2.tile_group, tiles)) << at;
  EXPECT_EQ(ints(rt.tile_row, tiles), ints(rt2.tile_row, tiles)) << at;
  EXPECT_EQ(ints(rt.topk_idx, P), ints(rt2.topk_idx, P)) << at;
  EXPECT_EQ(floats(rt.topk_w, P), floats(rt2.topk_w, P)) << at;
  // Pairs of one expert may take its slots in another order: each pair's slot must lie in its
  // expert's sorted range and hold its token and weight.
  {
    auto slot = ints(rt.slot_pair, P), tok = ints(rt.pair_token, P), eidx = ints(rt.topk_idx, P);
    auto pw = floats(rt.pair_weight, P), tw = floats(rt.topk_w, P);
    std::vector<int> start(c.E, 0), count(c.E, 0);
    for (int e : eidx) {
      if (e < 0 || e >= c.E) {
        ADD_FAILURE() << at << " expert " << e;
        return logits;
      }
      ++count[e];
    }
    for (int e = 1; e < c.E; ++e) start[e] = start[e - 1] + count[e - 1];
    std::vector<int> seen(P, 0);
    for (int p = 0; p < P; ++p) {
      const int sl = slot[p];
      if (!(sl >= 0 && sl < P)) {
        ADD_FAILURE() << at << " slot " << sl;
        return logits;
      }
      EXPECT_TRUE(sl >= start[eidx[p]] && sl < start[eidx[p]] + count[eidx[p]]) << at << " pair " << p;
      EXPECT_EQ(tok[sl], p / c.k) << at;
      EXPECT_EQ(pw[sl], tw[p]) << at;
      EXPECT_EQ(seen[sl]++, 0) << at << " slot taken twice";
    }
  }
  // And the top-k itself against the CPU's rule on these logits.
  std::vector<int32_t> idx(P);
  std::vector<float> wts(P);
  cpu::router_topk(logits.data(), c.n, c.E, c.k, idx.data(), wts.data());
  EXPECT_EQ(ints(rt.topk_idx, P), idx) << at;
  return logits;
}

// Every router variant (the old fused kernel up to 8 tokens; version 2's cluster shapes up to
// 64) at 1, 2, 7, 8, 33 and 64 tokens over 128 and 32 experts (120b / 20b), expert ranges,
// top-8 (the block sort past 32 pairs), odd expert counts and widths.
TEST_F(Kernels, RouterRouteFused) {
  std::vector<RouterCase> cases = {
      {1, 128, 2880, 4, 0, 128}, {2, 128, 2880, 4, 0, 128}, {7, 32, 2880, 4, 0, 32},  {8, 128, 2880, 4, 64, 128},
      {3, 200, 1024, 8, 0, 200}, {1, 8, 64, 2, 0, 8},       {8, 128, 2880, 8, 0, 128}, {6, 16, 512, 8, 4, 12},
      {33, 128, 2880, 4, 0, 128}, {64, 128, 2880, 4, 0, 128}, {64, 32, 2880, 4, 0, 32}, {33, 32, 2880, 4, 8, 24},
      {5, 32, 2880, 4, 0, 32},   {17, 128, 2880, 4, 0, 128}};
  if (small_mode()) cases = {{1, 32, 256, 4, 0, 32}, {8, 8, 64, 2, 2, 6}, {33, 32, 256, 4, 0, 32}};
  int ran = 0;
  for (const RouterCase& c : cases)
    for (int variant = 1; variant < cuda::kRouterVariants; ++variant)
      for (bool f16 : {false, true}) ran += !check_router_route(c, f16, false, variant, fresh_seed()).empty();
  cuda::set_router_variant(0);
  EXPECT_GE(ran, int(cases.size()) * 2) << "every shape ran under some variant";
}

// The router folded into o_proj at one token (RouterFold): o_proj (its staged kernel)
// -> gate_up -> down -> combine with no router launch, against the CPU's o_proj, RMSNorm, router,
// top-k, experts and weighted sum, for each decode format of o_proj, at 120b's and 20b's expert
// counts. The experts must be the CPU's, in its order (a draw with two of a token's top k + 1
// logits within 1e-3 of each other is drawn again), gate_up's block 0 must leave the combine its routing, the fold's sums must hold
// the residual's sum of squares, and a second pass gives the same bits. Then the combine folded
// too (RouterFold::moe_out, NormIn): the next layer's qkv and o_proj against the CPU's combine,
// RMSNorm, qkv and residual add.
struct FoldCase {
  int E, k, H, Q, I, QKV;
};

// A dense layer's one-token decode copy in a fragment format (random weights, bias), and the CPU's
// product with the weights it holds in effect.
struct DenseFrag {
  WeightMat::Format fmt;
  int N, K;
  WeightMat P;
  std::vector<float> bias;
  std::vector<uint16_t> weff;             // bf16 / fp8: the bf16 weights in effect
  std::vector<uint8_t> hblocks, hscales;  // MXFP4
  Dev<float> dbias;
  Dev<uint8_t> frag, aux, dblocks, dscales;
  Dev<uint16_t> dw;
  DenseFrag(WeightMat::Format f, int n, int k, FastRng& r, int* flag) : fmt(f), N(n), K(k) {
    bias = rand_f32(N, r, 0.1f);
    dbias = Dev<float>(bias);
    frag = Dev<uint8_t>(cuda::frag_weight_bytes(fmt, 1, N, K));
    aux = Dev<uint8_t>(size_t(N) * K / 32 + size_t(N) * 4);
    if (fmt == WeightMat::kFragMXFP4) {
      hblocks = rand_bytes(r, size_t(N) * K / 2);
      hscales = rand_bytes(r, size_t(N) * K / 32, 116, 123);
      dblocks = Dev<uint8_t>(hblocks);
      dscales = Dev<uint8_t>(hscales);
      P = cuda::pack_frag(WeightMat{WeightMat::kMXFP4, dblocks.p(), dscales.p(), dbias.p(), N, K}, 1, false, fmt,
                          frag.p(), aux.p(), flag, 0);
      return;
    }
    auto wb = to_bf16(rand_f32(size_t(N) * K, r, 0.02f));
    dw = Dev<uint16_t>(wb);
    P = cuda::pack_frag(WeightMat{WeightMat::kBF16, dw.p(), nullptr, dbias.p(), N, K}, 1, false, fmt, frag.p(), aux.p(),
                        flag, 0);
    GPTOSS_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> rs(N);
    if (fmt == WeightMat::kFragFP8) GPTOSS_CUDA_CHECK(cudaMemcpy(rs.data(), P.row_scale, N * 4, cudaMemcpyDeviceToHost));
    weff = fmt == WeightMat::kFragFP8 ? fp8_effective(wb, rs, N, K) : wb;
  }
  std::vector<float> cpu(const std::vector<float>& x) const {
    std::vector<float> y(N);
    if (fmt == WeightMat::kFragMXFP4)
      cpu::linear_mxfp4(x.data(), 1, K, hblocks.data(), hscales.data(), N, bias.data(), y.data());
    else
      cpu::linear_bf16(x.data(), 1, K, weff.data(), N, bias.data(), y.data());
    return y;
  }
  double bound() const { return fmt == WeightMat::kFragFP8 ? 6e-3 : 2e-3; }  // as SkinnyDense's
};

// Returns false (nothing checked) where the draw's logits come too close to a tie. n tokens, the
// first nv real (RouterFold::n_valid: the rest, a graph bucket's padding, take no pair).
bool check_router_fold(WeightMat::Format ofmt, const FoldCase& c, uint64_t seed, int n = 1, int nv = -1) {
  const int E = c.E, k = c.k, H = c.H, Q = c.Q, I = c.I;
  if (nv < 0) nv = n;
  FastRng r(seed);
  const std::string at = "fmt=" + std::to_string(ofmt) + " E=" + std::to_string(E) + " I=" + std::to_string(I) +
                         " n=" + std::to_string(n) + (nv < n ? " valid=" + std::to_string(nv) : "");
  auto a = round_bf16(rand_f32(size_t(n) * Q, r));
  auto x0 = rand_f32(size_t(n) * H, r, 3.f);
  auto nw = rand_f32(H, r, 0.1f, 1.f);
  auto rw = to_bf16(rand_f32(size_t(E) * H, r, 0.02f));
  auto rb = rand_f32(E, r, 0.1f);
  // o_proj in its decode format, and the CPU's product.
  Dev<int> flag(std::vector<int>{0});
  const DenseFrag dense_o(ofmt, H, Q, r, flag.p());
  const WeightMat& Po = dense_o.P;
  // The CPU's layer from o_proj's output on, token by token.
  std::vector<float> x1(size_t(n) * H), xn(size_t(n) * H), logits(size_t(n) * E);
  for (int t = 0; t < n; ++t) {
    const std::vector<float> o = dense_o.cpu(std::vector<float>(a.begin() + size_t(t) * Q, a.begin() + size_t(t + 1) * Q));
    for (int h = 0; h < H; ++h) x1[size_t(t) * H + h] = x0[size_t(t) * H + h] + o[h];
  }
  cpu::rmsnorm(x1.data(), nw.data(), n, H, 1e-5f, xn.data());
  cpu::linear_bf16(xn.data(), n, H, rw.data(), E, rb.data(), logits.data());
  // Near-ties anywhere in a token's top k + 1: at the k-th / (k+1)-th boundary the experts could
  // differ, within the k their order (topk_idx is compared in selection order). (An H200 run saw
  // a pair of selected experts swap under fp8 o_proj, the results equal.)
  for (int t = 0; t < nv; ++t) {
    std::vector<float> sorted(logits.begin() + size_t(t) * E, logits.begin() + size_t(t + 1) * E);
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    for (int j = 0; j < k; ++j)
      if (sorted[j] - sorted[j + 1] < 1e-3f) return false;
  }
  std::vector<int32_t> idx(size_t(n) * k);
  std::vector<float> wts(size_t(n) * k);
  cpu::router_topk(logits.data(), n, E, k, idx.data(), wts.data());
  auto gu_b = rand_bytes(r, size_t(E) * 2 * I * H / 2), gu_s = rand_bytes(r, size_t(E) * 2 * I * H / 32, 118, 121);
  auto dn_b = rand_bytes(r, size_t(E) * H * I / 2), dn_s = rand_bytes(r, size_t(E) * H * I / 32, 118, 121);
  auto gu_bias = rand_f32(size_t(E) * 2 * I, r, 0.1f), dn_bias = rand_f32(size_t(E) * H, r, 0.1f);
  std::vector<float> ref = x1;
  for (int t = 0; t < nv; ++t)
    for (int j = 0; j < k; ++j) {
      const int e = idx[size_t(t) * k + j];
      std::vector<float> gu(2 * size_t(I)), act(I), y(H);
      cpu::linear_mxfp4(&xn[size_t(t) * H], 1, H, &gu_b[size_t(e) * 2 * I * H / 2], &gu_s[size_t(e) * 2 * I * H / 32],
                        2 * I, &gu_bias[size_t(e) * 2 * I], gu.data());
      cpu::swiglu(gu.data(), 1, I, 7.f, act.data());
      cpu::linear_mxfp4(act.data(), 1, I, &dn_b[size_t(e) * H * I / 2], &dn_s[size_t(e) * H * I / 32], H,
                        &dn_bias[size_t(e) * H], y.data());
      for (int h = 0; h < H; ++h) ref[size_t(t) * H + h] += wts[size_t(t) * k + j] * y[h];
    }
  // The real tokens' rows of a token-major [n][H] vector.
  auto real_rows = [&](const std::vector<float>& v) { return std::vector<float>(v.begin(), v.begin() + size_t(nv) * H); };
  // The device: experts in the fragment layout, the fold's sums and transposed router.
  Dev<float> dgub(gu_bias), ddnb(dn_bias), dnw(nw), drb(rb), dx(x0), dxg(size_t(n) * H), dbias_l2(E);
  Dev<uint16_t> drw(rw), dwt(size_t(E) * H), da(to_bf16(a));
  Dev<uint8_t> dgu_b(gu_b), dgu_s(gu_s), ddn_b(dn_b), ddn_s(dn_s);
  Dev<uint8_t> fgu(cuda::frag_weight_bytes(WeightMat::kFragMXFP4, E, 2 * I, H)), fgus(gu_s.size());
  Dev<uint8_t> fdn(cuda::frag_weight_bytes(WeightMat::kFragMXFP4, E, H, I)), fdns(dn_s.size());
  WeightMat pgu = cuda::pack_frag(WeightMat{WeightMat::kMXFP4, dgu_b.p(), dgu_s.p(), dgub.p(), 2 * I, H}, E, true,
                                  WeightMat::kFragMXFP4, fgu.p(), fgus.p(), flag.p(), 0);
  WeightMat pdn = cuda::pack_frag(WeightMat{WeightMat::kMXFP4, ddn_b.p(), ddn_s.p(), ddnb.p(), H, I}, E, false,
                                  WeightMat::kFragMXFP4, fdn.p(), fdns.p(), flag.p(), 0);
  cuda::router_fold_transpose(reinterpret_cast<const cuda::bf16_t*>(drw.p()), E, H,
                              reinterpret_cast<cuda::bf16_t*>(dwt.p()), 0);
  const size_t nacc = size_t(n) * (E + 1);
  Dev<long long> acc(nacc);
  Dev<int32_t> dvalid(std::vector<int32_t>{nv});
  Dev<uint8_t> rmem(cuda::moe_routing_bytes(n * k, E));
  auto rt = cuda::moe_routing_carve(rmem.p(), n * k, E);
  Dev<uint16_t> act(size_t(n) * k * I);
  Dev<float> y(size_t(n) * k * H);
  cuda::RouterFold fold{acc.p(), reinterpret_cast<const cuda::bf16_t*>(dwt.p()), dnw.p(), drb.p(),
                        dbias_l2.p(), dxg.p(), 1e-5f, E, k, H, false};
  fold.n = n;
  fold.n_valid = nv < n ? dvalid.p() : nullptr;
  std::vector<float> first;
  for (int pass = 0; pass < 2; ++pass) {
    acc.upload(std::vector<long long>(nacc, 0));
    dx.upload(x0);
    y.poison();
    act.poison();
    rmem.poison();
    dbias_l2.poison();
    const bool folded = cuda::linear_router_fold(Po, reinterpret_cast<const cuda::bf16_t*>(da.p()), Q, n,
                                                 Epilogue{Epilogue::kAddF32, dx.p(), H}, fold, 0);
    EXPECT_TRUE(folded) << at;
    if (!folded) return true;
    cuda::MoeRouting rg = rt, rd = rt;
    rg.fold = fold;
    rg.fold.gate_up = true;
    rd.fold = fold;
    rd.settled = true;
    Epilogue ge{Epilogue::kSwiGLU, act.p(), I};
    ge.out_f16 = true;
    cuda::linear_grouped(pgu, act.p(), H, n * k, E, true, rg, ge, 0, n, true);  // (A unused: the rows come from xg)
    cuda::linear_grouped(pdn, act.p(), I, n * k, E, false, rd, Epilogue{Epilogue::kStoreF32, y.p(), H}, 0, n, true);
    if (pass == 0) {  // o_proj's residual, sums and xg, before the combine (every token's)
      // (Against the device's own residual: the CPU's fp8 o_proj is the bound's approximation.)
      const auto x1d = dx.download();
      EXPECT_LE(rel_err(x1d, x1), dense_o.bound()) << at << ": o_proj";
      auto sums = acc.download();
      const auto xg = dxg.download();
      for (int t = 0; t < n; ++t) {
        double ss = 0;
        for (int h = 0; h < H; ++h) ss += double(x1d[size_t(t) * H + h]) * x1d[size_t(t) * H + h];
        EXPECT_NEAR(double(sums[size_t(t) * (E + 1) + E]) / 16777216.0, ss, 1e-5 * ss)
            << at << ": the sum of squares of token " << t;
      }
      std::vector<float> xg_ref(size_t(n) * H);
      for (size_t i = 0; i < xg_ref.size(); ++i) xg_ref[i] = x1d[i] * nw[i % H];
      EXPECT_LE(rel_err(xg, xg_ref), 1e-6) << at;
    }
    cuda::moe_combine(y.p(), rt, n, k, H, dx.p(), nullptr, 1e-5f, nullptr, 0);
    GPTOSS_CUDA_CHECK(cudaDeviceSynchronize());
    const int Pv = nv * k;
    std::vector<int32_t> gidx(Pv);
    std::vector<float> gw(Pv);
    GPTOSS_CUDA_CHECK(cudaMemcpy(gidx.data(), rt.topk_idx, Pv * 4, cudaMemcpyDeviceToHost));
    GPTOSS_CUDA_CHECK(cudaMemcpy(gw.data(), rt.topk_w, Pv * 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(gidx, std::vector<int32_t>(idx.begin(), idx.begin() + Pv)) << at << ": the experts";
    EXPECT_LE(rel_err(gw, std::vector<float>(wts.begin(), wts.begin() + Pv)), ofmt == WeightMat::kFragFP8 ? 3e-3 : 1e-4)
        << at << ": their weights";
    if (nv < n) {  // the padding's slots point at sorted pair 0; only the real tokens' pairs are sorted
      std::vector<int32_t> slot(size_t(n) * k), counts(2), gend(E);
      GPTOSS_CUDA_CHECK(cudaMemcpy(slot.data(), rt.slot_pair, slot.size() * 4, cudaMemcpyDeviceToHost));
      GPTOSS_CUDA_CHECK(cudaMemcpy(counts.data(), rt.counts, 8, cudaMemcpyDeviceToHost));
      GPTOSS_CUDA_CHECK(cudaMemcpy(gend.data(), rt.group_end, E * 4, cudaMemcpyDeviceToHost));
      for (int p = Pv; p < n * k; ++p) EXPECT_EQ(slot[p], 0) << at << ": padding pair " << p;
      EXPECT_GT(counts[0], 0) << at;
      if (counts[0] > 0 && counts[0] <= E) {
        EXPECT_EQ(gend[counts[0] - 1], Pv) << at << ": only the real tokens' pairs";
      }
    }
    auto got = real_rows(dx.download());
    EXPECT_LE(rel_err(got, real_rows(ref)), 1e-2) << at;
    if (pass == 0) {
      first = got;
      std::printf("router fold %s: rel err %.3g\n", at.c_str(), rel_err(got, real_rows(ref)));
    } else {
      EXPECT_EQ(0, std::memcmp(first.data(), got.data(), got.size() * 4)) << at << ": a second pass, other bits";
    }
  }
  if (n > 1) {  // (the combine folds at one token only)
    EXPECT_EQ(flag.download()[0], 0);
    return true;
  }
  // The combine folded as well (RouterFold::moe_out, NormIn): down adds the weighted rows into
  // fixed-point sums; the next layer's qkv (same format as o_proj) normalizes x + those sums as it
  // stages its row, and its o_proj (another token's attention output, the same weights) adds them
  // to the residual. No combine launch.
  {
    const DenseFrag dense_qkv(ofmt, c.QKV, H, r, flag.p());
    auto nw2 = rand_f32(H, r, 0.1f, 1.f);
    auto a2 = round_bf16(rand_f32(Q, r));
    Dev<float> dnw2(nw2);
    Dev<long long> moe(H), acc2(E + 1);
    Dev<uint16_t> dq(c.QKV), da2(to_bf16(a2));
    acc.upload(std::vector<long long>(E + 1, 0));
    acc2.upload(std::vector<long long>(E + 1, 0));
    moe.upload(std::vector<long long>(H, 0));
    dx.upload(x0);
    cuda::RouterFold f1 = fold;
    bool ok = cuda::linear_router_fold(Po, reinterpret_cast<const cuda::bf16_t*>(da.p()), Q, 1,
                                       Epilogue{Epilogue::kAddF32, dx.p(), H}, f1, 0);
    EXPECT_TRUE(ok) << at;
    if (!ok) return true;
    cuda::MoeRouting rg = rt, rd = rt;
    rg.fold = f1;
    rg.fold.gate_up = true;
    rd.fold = f1;
    rd.fold.moe_out = moe.p();
    rd.settled = true;
    Epilogue ge{Epilogue::kSwiGLU, act.p(), I};
    ge.out_f16 = true;
    cuda::linear_grouped(pgu, act.p(), H, k, E, true, rg, ge, 0, 1, true);
    cuda::linear_grouped(pdn, act.p(), I, k, E, false, rd, Epilogue{Epilogue::kStoreF32, y.p(), H}, 0, 1, true);
    // qkv's norm-in kernel with its row staged by each block alone, by clusters of 2, 8 and 4
    // blocks, and by clusters of 4 through the bulk-copy engine's multicast (last: the cluster
    // size left at the default), each against the CPU below. The multicast staging runs each
    // block's arithmetic on the same row, so where it is taken (sm_90a code on a 9.0 device) its
    // result is the each-block one, bit for bit.
    std::vector<std::vector<uint16_t>> q_by_cluster;
    for (int cl : {1, 2, 8, 4, -4}) {
      cuda::set_norm_in_cluster(cl < 0 ? -cl : cl);
      const bool was = cuda::set_norm_in_multicast(cl < 0);
      dq.upload(std::vector<uint16_t>(c.QKV, 0));
      ok = cuda::linear_norm_in(dense_qkv.P, cuda::NormIn{dx.p(), moe.p(), dnw2.p(), 1e-5f}, 1,
                                Epilogue{Epilogue::kStoreBF16, dq.p(), c.QKV}, 0);
      cuda::set_norm_in_multicast(was);
      EXPECT_TRUE(ok) << at << ": qkv's norm-in kernel, clusters of " << cl;
      if (!ok) return true;
      q_by_cluster.push_back(dq.download());
      const std::string staged = cuda::last_norm_in_staging();
      if (cl > 0) EXPECT_EQ(staged, cl == 1 ? "block" : "cluster") << at;
      else EXPECT_TRUE(staged == "multicast" || staged == "cluster") << at << ": " << staged;
      if (cl < 0 && cuda::expert_gemm_v3_available()) {
        EXPECT_EQ(staged, "multicast") << at << ": sm_90a on a 9.0 device: the multicast staging";
        EXPECT_EQ(0, std::memcmp(q_by_cluster.front().data(), q_by_cluster.back().data(), c.QKV * 2))
            << at << ": the multicast staging's qkv differs from each block's";
      }
    }
    cuda::RouterFold f2 = fold;
    f2.acc = acc2.p();
    f2.moe_in = moe.p();
    ok = cuda::linear_router_fold(Po, reinterpret_cast<const cuda::bf16_t*>(da2.p()), Q, 1,
                                  Epilogue{Epilogue::kAddF32, dx.p(), H}, f2, 0);
    EXPECT_TRUE(ok) << at;
    if (!ok) return true;
    GPTOSS_CUDA_CHECK(cudaDeviceSynchronize());
    // CPU: x2 = ref (x1 + the weighted expert rows); qkv of rmsnorm(x2); x3 = x2 + o_proj(a2).
    std::vector<float> xn2(H);
    cpu::rmsnorm(ref.data(), nw2.data(), 1, H, 1e-5f, xn2.data());
    const auto q_ref = dense_qkv.cpu(xn2);
    double eq = 0;
    for (size_t i = 0; i < q_by_cluster.size(); ++i) {
      const double e = rel_err(from_bf16(q_by_cluster[i]), q_ref);
      EXPECT_LE(e, dense_qkv.bound() + 4e-3) << at << ": qkv of the folded combine's rows, cluster size #" << i;
      eq = std::max(eq, e);
    }
    const auto o2 = dense_o.cpu(a2);
    std::vector<float> x3 = ref;
    for (int h = 0; h < H; ++h) x3[h] += o2[h];
    const double ex = rel_err(dx.download(), x3);
    EXPECT_LE(ex, 1e-2) << at << ": the residual after the next o_proj";
    std::printf("combine fold %s: qkv rel err %.3g, residual %.3g\n", at.c_str(), eq, ex);
  }
  EXPECT_EQ(flag.download()[0], 0);
  return true;
}

TEST_F(Kernels, RouterFoldedIntoOproj) {
  // (The fold's expert kernels take gpt-oss's K = 2880 only: router_fold_experts_take.)
  std::vector<FoldCase> cases = {{128, 4, 2880, 4096, 2880, 5120}, {32, 4, 2880, 4096, 2880, 5120}};
  if (small_mode()) cases = {{32, 4, 2880, 4096, 2880, 5120}};
  for (auto ofmt : {WeightMat::kFragBF16, WeightMat::kFragFP8, WeightMat::kFragMXFP4})
    for (const FoldCase& c : cases) {
      int tries = 0;
      while (!check_router_fold(ofmt, c, fresh_seed())) ASSERT_LT(++tries, 20) << "no draw without a near-tie";
    }
}

// The fold at 2-8 tokens (launches of fold capacity 4 at 2-4, 8 at 5-8: kernels.h): every token's
// sums, experts, weights and result against the CPU's, the pairs sorted as the decode router sorts
// them (the combine reads gate_up's block 0's routing), and a graph bucket's padding (RouterFold::n_valid) taking no pair. gate_up runs the warp walk
// from 3 tokens, down from 6 (where their units fill the GPU twice over), the K-split kernel below.
TEST_F(Kernels, RouterFoldedIntoOprojTokens) {
  struct TokCase {
    WeightMat::Format fmt;
    int E, n, nv;
  };
  std::vector<TokCase> cases = {{WeightMat::kFragBF16, 32, 2, 2},  {WeightMat::kFragFP8, 32, 3, 3},
                                {WeightMat::kFragMXFP4, 32, 4, 4}, {WeightMat::kFragBF16, 128, 4, 4},
                                {WeightMat::kFragFP8, 128, 4, 3},  {WeightMat::kFragBF16, 32, 2, 1},
                                {WeightMat::kFragFP8, 128, 8, 8},  {WeightMat::kFragBF16, 128, 8, 5},
                                {WeightMat::kFragMXFP4, 32, 6, 6}, {WeightMat::kFragMXFP4, 128, 5, 5}};
  if (small_mode()) cases = {{WeightMat::kFragBF16, 32, 4, 3}, {WeightMat::kFragFP8, 32, 3, 2}, {WeightMat::kFragFP8, 32, 8, 6}};
  for (const TokCase& tc : cases) {
    const FoldCase c{tc.E, 4, 2880, 4096, 2880, 5120};
    int tries = 0;
    while (!check_router_fold(tc.fmt, c, fresh_seed(), tc.n, tc.nv)) ASSERT_LT(++tries, 20) << "no draw without a near-tie";
  }
}

// Exact ties everywhere (zero router rows, biases from three values): the lower expert index wins
// on the device as on the CPU, for every variant, at 1-64 tokens, 32 and 128 experts.
TEST_F(Kernels, RouterRouteTies) {
  std::vector<RouterCase> cases = {{1, 128, 2880, 4, 0, 128}, {8, 32, 2880, 4, 0, 32}, {64, 128, 2880, 4, 0, 128},
                                   {33, 32, 2880, 4, 0, 32},  {2, 8, 64, 2, 0, 8}};
  if (small_mode()) cases = {{1, 32, 256, 4, 0, 32}, {33, 8, 64, 2, 0, 8}};
  for (const RouterCase& c : cases)
    for (int variant = 1; variant < cuda::kRouterVariants; ++variant) check_router_route(c, false, true, variant, fresh_seed());
  cuda::set_router_variant(0);
}

// Version 2 against the old fused kernel on the same inputs (up to 8 tokens, where both run):
// logits within the GEMV's rounding, normalized rows within a bf16 step.
TEST_F(Kernels, RouterRouteV2MatchesOld) {
  std::vector<RouterCase> cases = {{1, 128, 2880, 4, 0, 128}, {2, 32, 2880, 4, 0, 32}, {7, 128, 2880, 4, 0, 128},
                                   {8, 32, 2880, 4, 0, 32}};
  if (small_mode()) cases = {{1, 32, 256, 4, 0, 32}, {8, 8, 64, 2, 0, 8}};
  for (const RouterCase& c : cases) {
    const uint64_t seed = fresh_seed();
    auto old_logits = check_router_route(c, false, false, 1, seed);
    ASSERT_FALSE(old_logits.empty());
    for (int variant = 2; variant < cuda::kRouterVariants; ++variant) {
      auto v2 = check_router_route(c, false, false, variant, seed);
      ASSERT_FALSE(v2.empty()) << cuda::router_variant_name(variant) << " n=" << c.n;
      EXPECT_LE(rel_err(v2, old_logits), 2e-3) << cuda::router_variant_name(variant) << " n=" << c.n;
    }
  }
  cuda::set_router_variant(0);
}

// A graph bucket's padding (MoeRouting::n_valid): the fused decode router (every variant) routes the first
// n_valid tokens as moe_route routes them alone (every routing array equal), gives the padding
// tokens no pair, and points their slots at sorted pair 0. 40 tokens with 33 real (bucket 40),
// 64 with 47, 8 with 5, over 32 and 128 experts.
TEST_F(Kernels, RouterRoutePaddingTakesNoPair) {
  struct Pad {
    int n, valid, E;
  };
  std::vector<Pad> cases = {{40, 33, 32}, {64, 47, 128}, {8, 5, 128}, {64, 57, 32}};
  const int K = small_mode() ? 256 : 2880, k = 4;
  int ran = 0;
  for (const Pad& c : cases)
    for (int variant = 1; variant < cuda::kRouterVariants; ++variant) {
      cuda::set_router_variant(variant);
      if (!cuda::router_route_fuses(c.n, K, c.E, k)) continue;
      ++ran;
      FastRng r(fresh_seed());
      auto x = rand_f32(size_t(c.n) * K, r, 3.f);
      auto nw = rand_f32(K, r, 0.1f, 1.f);
      auto wb = to_bf16(rand_f32(size_t(c.E) * K, r, 0.02f));
      Dev<float> dx(x), dnw(nw), dlog(size_t(c.n) * c.E);
      Dev<uint16_t> dw(wb), dxn(x.size());
      Dev<int> ticket(std::vector<int>{0}), valid(std::vector<int>{c.valid});
      const int P = c.n * k, Pv = c.valid * k;
      Dev<uint8_t> rmem(cuda::moe_routing_bytes(P, c.E)), rmem2(cuda::moe_routing_bytes(P, c.E));
      auto rt = cuda::moe_routing_carve(rmem.p(), P, c.E), rt2 = cuda::moe_routing_carve(rmem2.p(), P, c.E);
      GPTOSS_CUDA_CHECK(cudaMemset(rt.slot_pair, 0x7f, size_t(P) * 4));  // what a stale slot would hold
      rt.n_valid = valid.p();
      cuda::moe_router_route(reinterpret_cast<const cuda::bf16_t*>(dw.p()), nullptr, c.E, K, dx.p(), dnw.p(), 1e-5f, c.n,
                             dxn.p(), true, dlog.p(), k, rt, ticket.p(), 0, 0, c.E);
      cuda::moe_route(dlog.p(), c.valid, c.E, k, rt2, 0, 0, c.E);  // the real tokens' logits alone
      GPTOSS_CUDA_CHECK(cudaDeviceSynchronize());
      auto ints = [&](const int32_t* p, size_t count) {
        std::vector<int32_t> v(count);
        GPTOSS_CUDA_CHECK(cudaMemcpy(v.data(), p, count * 4, cudaMemcpyDeviceToHost));
        return v;
      };
      const std::string at = "n=" + std::to_string(c.n) + " valid=" + std::to_string(c.valid) + " E=" +
                             std::to_string(c.E) + " " + cuda::router_variant_name(variant);
      ASSERT_EQ(ints(rt.counts, 2), ints(rt2.counts, 2)) << at;
      const int groups = ints(rt2.counts, 1)[0];
      EXPECT_EQ(ints(rt.group_expert, groups), ints(rt2.group_expert, groups)) << at;
      EXPECT_EQ(ints(rt.group_start, groups), ints(rt2.group_start, groups)) << at;
      EXPECT_EQ(ints(rt.group_end, groups), ints(rt2.group_end, groups)) << at;
      EXPECT_EQ(ints(rt2.group_end, groups).back(), Pv) << at << ": only the real tokens' pairs";
      EXPECT_EQ(ints(rt.topk_idx, Pv), ints(rt2.topk_idx, Pv)) << at;
      auto slot = ints(rt.slot_pair, P), tok = ints(rt.pair_token, Pv);
      for (int p = 0; p < P; ++p) {
        if (p >= Pv) {
          EXPECT_EQ(slot[p], 0) << at << " padding pair " << p;
        } else if (slot[p] < 0 || slot[p] >= Pv) {
          ADD_FAILURE() << at << " pair " << p << " slot " << slot[p];
        } else {
          EXPECT_EQ(tok[slot[p]], p / k) << at << " pair " << p;
        }
      }
    }
  cuda::set_router_variant(0);
  EXPECT_GE(ran, int(cases.size())) << "every case ran under some variant";
}

// Every combine variant (old clusters, version 2 with 1, 2, 4, 8 blocks per token) at 1-64 tokens
// over 32 and 128 experts: the residual bit for bit the same (experts added in order j = 0..k-1
// everywhere) and equal to the CPU's, the normalized rows within bf16 rounding of the CPU's; with
// no norm (tensor-parallel) the residual only.
TEST_F(Kernels, MoeCombineVariants) {
  const int H = small_mode() ? 96 : 2880;
  for (int E : {32, 128})
    for (int n : {1, 2, 7, 8, 33, 64}) {
      if (small_mode() && n > 8) continue;
      FastRng r(fresh_seed());
      const int k = 4, P = n * k;
      auto logits = rand_f32(size_t(n) * E, r);
      auto y = rand_f32(size_t(P) * H, r);
      auto x = rand_f32(size_t(n) * H, r, 2.f);
      auto nw = rand_f32(H, r, 0.1f, 1.f);
      Dev<float> dlog(logits), dy(y), dnw(nw);
      Dev<uint8_t> rmem(cuda::moe_routing_bytes(P, E));
      auto rt = cuda::moe_routing_carve(rmem.p(), P, E);
      cuda::moe_route(dlog.p(), n, E, k, rt, 0);
      std::vector<int32_t> slot(P);
      std::vector<float> w(P);
      GPTOSS_CUDA_CHECK(cudaMemcpy(slot.data(), rt.slot_pair, P * 4, cudaMemcpyDeviceToHost));
      GPTOSS_CUDA_CHECK(cudaMemcpy(w.data(), rt.topk_w, P * 4, cudaMemcpyDeviceToHost));
      std::vector<float> ref = x, xn(x.size());
      for (int t = 0; t < n; ++t)
        for (int h = 0; h < H; ++h) {
          float sum = 0.f;
          for (int j = 0; j < k; ++j) sum = std::fma(w[t * k + j], y[size_t(slot[t * k + j]) * H + h], sum);
          ref[size_t(t) * H + h] += sum;
        }
      cpu::rmsnorm(ref.data(), nw.data(), n, H, 1e-5f, xn.data());
      std::vector<float> first_x;
      for (int variant = 1; variant < cuda::kCombineVariants; ++variant) {
        cuda::set_combine_variant(variant);
        const std::string at = "E=" + std::to_string(E) + " n=" + std::to_string(n) + " " +
                               cuda::combine_variant_name(variant);
        Dev<float> dx(x), dx2(x);
        Dev<uint16_t> dxn(size_t(n) * H), dxn2(size_t(n) * H);
        cuda::moe_combine(dy.p(), rt, n, k, H, dx.p(), dnw.p(), 1e-5f, dxn.p(), 0);
        cuda::moe_combine(dy.p(), rt, n, k, H, dx2.p(), nullptr, 1e-5f, dxn2.p(), 0);
        auto gx = dx.download();
        EXPECT_EQ(gx, ref) << at;
        EXPECT_EQ(dx2.download(), gx) << at << " (no norm)";
        EXPECT_LE(rel_err(from_bf16(dxn.download()), xn), 5e-3) << at;
        auto untouched = dxn2.download();
        EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(), [](uint16_t b) { return b == 0xffff; }))
            << at << ": no norm writes no normalized rows";
        if (first_x.empty()) first_x = gx;
        EXPECT_EQ(gx, first_x) << at << " against the old kernel";
      }
      cuda::set_combine_variant(0);
    }
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

// Attention over pages: K/V of every earlier position are stored by rope_kv_store (as earlier
// passes would have), then the new tokens of each sequence go through RoPE + store + attention.
struct AttnSeq {
  int start, n;
};

// Options of check_attention beyond the shape: the kernel, the page size, and a fixed seed (0:
// fresh) from which every sequence's data derives by its (start, n) alone, so one sequence gets
// the same values alone and batched (the batch-invariance test).
struct AttnRun {
  cuda::AttentionPath path = cuda::AttentionPath::kAuto;
  int page_size = 16;
  uint64_t seed = 0;
  cuda::AttentionPassInfo info{};  // kAuto's hints (zeros: per-token kernel only)
  // attention_decode with `plan` for the new tokens (one a sequence) instead of rope_kv_store +
  // attention; the history is stored by rope_kv_store either way.
  bool fused = false;
  cuda::DecodeAttentionPlan plan{};
  // With fused: rope_kv_store first, then attention_decode in its stored mode (sequences may bring
  // several tokens: speculative verify passes).
  bool kv_stored = false;
  std::vector<uint8_t>* pool_after = nullptr;  // if set: the KV pages after the pass
  // Check against the CPU reference (false: only run the pass and return its rows, for tests that
  // compare two GPU paths each already checked against the CPU elsewhere).
  bool cpu_reference = true;
};

// Returns the kernel's output rows (pass order: sequence after sequence).
std::vector<float> check_attention(const std::vector<AttnSeq>& seqs, int window, bool fp8, int nsplit, int Hq,
                                   int Hkv, int D, const AttnRun& run = {}) {
  const uint64_t seed = run.seed ? run.seed : fresh_seed();
  FastRng r(seed);
  const int ps = run.page_size, QKV = (Hq + 2 * Hkv) * D;
  GptOssConfig cfg;
  cfg.head_dim = D;
  YarnTables yarn = compute_yarn(cfg);
  // Pages: a shuffled pool so page tables are not the identity.
  int total_pages = 0;
  for (auto& s : seqs) total_pages += (s.start + s.n + ps - 1) / ps;
  std::vector<int32_t> perm(total_pages);
  std::iota(perm.begin(), perm.end(), 0);
  for (int i = total_pages - 1; i > 0; --i) std::swap(perm[i], perm[r.next() % (i + 1)]);
  std::vector<int32_t> pt;
  std::vector<int> pt_off;
  for (auto& s : seqs) {
    pt_off.push_back(int(pt.size()));
    int np = (s.start + s.n + ps - 1) / ps;
    for (int i = 0; i < np; ++i) pt.push_back(perm[pt.size()]);
  }
  const size_t page_elems = size_t(2) * ps * Hkv * D;
  Dev<uint8_t> pool(size_t(total_pages) * page_elems * (fp8 ? 1 : 2));
  Dev<int32_t> dpt(pt);
  Dev<float> dinv(yarn.inv_freq);
  cuda::KvLayer kv{pool.p(), fp8, ps};
  FastRng rsink(seed + 17);
  auto sinks = rand_f32(Hq, rsink);
  Dev<float> dsinks(sinks);

  // qkv of every position of every sequence (bf16 values), rows grouped by sequence.
  std::vector<std::vector<float>> all(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    FastRng rs(seed * 0x9E3779B97F4A7C15ull + uint64_t(seqs[i].start) * 1000003u + uint64_t(seqs[i].n));
    all[i] = round_bf16(rand_f32(size_t(seqs[i].start + seqs[i].n) * QKV, rs));
  }
  auto run_pass = [&](bool history) {
    std::vector<float> rows;
    std::vector<int32_t> pos, off;
    for (size_t i = 0; i < seqs.size(); ++i) {
      int a = history ? 0 : seqs[i].start, b = history ? seqs[i].start : seqs[i].start + seqs[i].n;
      for (int p = a; p < b; ++p) {
        rows.insert(rows.end(), &all[i][size_t(p) * QKV], &all[i][size_t(p + 1) * QKV]);
        pos.push_back(p);
        off.push_back(pt_off[i]);
      }
    }
    int n = int(pos.size());
    if (n == 0) return std::make_pair(std::vector<float>(), std::vector<float>());
    Dev<uint16_t> dq(to_bf16(rows));
    Dev<int32_t> dpos(pos), doff(off);
    cuda::TokenMeta tm{dpos.p(), doff.p(), dpt.p()};
    if (history || !run.fused || run.kv_stored) cuda::rope_kv_store(dq.p(), n, Hq, Hkv, D, dinv.p(), yarn.attention_scaling, tm, kv, 0);
    if (history) {
      GPTOSS_CUDA_CHECK(cudaDeviceSynchronize());
      return std::make_pair(std::vector<float>(), std::vector<float>());
    }
    Dev<float> part(cuda::attention_partial_floats(n, Hq, D, std::max(nsplit, run.plan.nsplit)));
    Dev<uint16_t> out(size_t(n) * Hq * D);
    if (run.fused)
      cuda::attention_decode(dq.p(), n, Hq, Hkv, D, window, dsinks.p(), dinv.p(), yarn.attention_scaling, tm, kv,
                             run.plan, part.p(), out.p(), 0, run.kv_stored);
    else
      cuda::attention(dq.p(), n, Hq, Hkv, D, window, dsinks.p(), tm, kv, nsplit, part.p(), out.p(), 0, run.path,
                      run.info);
    if (run.pool_after) {
      run.pool_after->resize(pool.n);
      GPTOSS_CUDA_CHECK(cudaMemcpy(run.pool_after->data(), pool.p(), pool.n, cudaMemcpyDeviceToHost));
    }
    return std::make_pair(from_bf16(out.download()), from_bf16(dq.download()));
  };
  run_pass(true);
  auto [got, qkv_after] = run_pass(false);
  if (!run.cpu_reference) return got;

  // CPU reference, sequence by sequence.
  std::vector<float> ref, ref_q, got_q;
  size_t row = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int L = seqs[i].start + seqs[i].n, n = seqs[i].n;
    std::vector<float> q(size_t(L) * Hq * D), k(size_t(L) * Hkv * D), v(size_t(L) * Hkv * D);
    std::vector<int32_t> pos(L);
    std::iota(pos.begin(), pos.end(), 0);
    for (int p = 0; p < L; ++p) {
      const float* src = &all[i][size_t(p) * QKV];
      std::copy_n(src, Hq * D, &q[size_t(p) * Hq * D]);
      std::copy_n(src + Hq * D, Hkv * D, &k[size_t(p) * Hkv * D]);
      std::copy_n(src + (Hq + Hkv) * D, Hkv * D, &v[size_t(p) * Hkv * D]);
    }
    cpu::rope(q.data(), L, Hq, D, pos.data(), yarn);
    cpu::rope(k.data(), L, Hkv, D, pos.data(), yarn);
    auto store_round = [&](std::vector<float>& t) {
      for (auto& x : t) {
        x = bf16_to_f32(f32_to_bf16(x));
        if (fp8) x = fp8_e4m3_to_f32(f32_to_fp8_e4m3(x));
      }
    };
    q = round_bf16(q);
    store_round(k);
    store_round(v);
    std::vector<float> o(size_t(n) * Hq * D);
    const float* qn = &q[size_t(seqs[i].start) * Hq * D];
    cpu::attention(qn, n, seqs[i].start, k.data(), v.data(), 0, L, Hq, Hkv, D, window, sinks.data(), o.data());
    ref.insert(ref.end(), o.begin(), o.end());
    ref_q.insert(ref_q.end(), qn, qn + size_t(n) * Hq * D);
    for (int t = 0; t < n; ++t, ++row)
      got_q.insert(got_q.end(), &qkv_after[row * QKV], &qkv_after[row * QKV + Hq * D]);
  }
  std::string what = "window=" + std::to_string(window) + " fp8=" + std::to_string(fp8) + " nsplit=" +
                     std::to_string(nsplit) + " seqs=" + std::to_string(seqs.size()) + " first start=" +
                     std::to_string(seqs[0].start) + " n=" + std::to_string(seqs[0].n) +
                     " ps=" + std::to_string(ps) + " Hq/Hkv=" + std::to_string(Hq) + "/" + std::to_string(Hkv) +
                     (run.path == cuda::AttentionPath::kFlash ? " flash" : "") +
                     (run.info.max_seq_tokens ? " auto max_seq_tokens=" + std::to_string(run.info.max_seq_tokens) : "") +
                     (run.fused ? std::string(run.kv_stored ? " stored" : " fused") + " plan=" +
                                      std::to_string(run.plan.nsplit) + (run.plan.cluster ? " cluster" : " split") +
                                      (run.plan.mma ? " mma" : "")
                                : "");
  if (!run.fused || run.kv_stored) {  // fused: q is left unrotated
    EXPECT_LE(rel_err(got_q, ref_q), 1e-2) << "rope: " << what;
  }
  double e = rel_err(got, ref);
  EXPECT_LE(e, 1.5e-2) << what;
  // Token by token too, so one wrong row (a mask off by one at a tile or page edge) cannot hide
  // in the whole batch's error.
  const size_t tok_elems = size_t(Hq) * D;
  int bad = 0;
  for (size_t t = 0; t * tok_elems < got.size() && bad < 5; ++t) {
    std::vector<float> g(got.begin() + t * tok_elems, got.begin() + (t + 1) * tok_elems);
    std::vector<float> w(ref.begin() + t * tok_elems, ref.begin() + (t + 1) * tok_elems);
    const double et = rel_err(g, w);
    if (et > 4e-2) {
      ++bad;
      ADD_FAILURE() << what << ": pass row " << t << " rel err " << et;
    }
  }
  std::printf("attention %s: rel err %.3g\n", what.c_str(), e);
  return got;
}

TEST_F(Kernels, AttentionPaged) {
  std::vector<std::vector<AttnSeq>> batches = {
      {{0, 1}},                               // first token
      {{200, 1}, {5, 1}, {2048, 1}},          // decode batch, contexts across 128
      {{0, 33}},                              // prefill
      {{100, 129}},                           // chunked prefill crossing the window
      {{127, 2}, {0, 129}},                   // mixed
  };
  if (!small_mode()) batches.push_back({{0, 2049}});
  const int Hq = small_mode() ? 8 : 64, Hkv = small_mode() ? 1 : 8;
  for (auto& b : batches)
    for (int window : {0, 128})
      for (bool fp8 : {false, true})
        for (int nsplit : {1, 5, 32}) {
          if (b.size() == 1 && b[0].n > 129 && nsplit != 1) continue;
          check_attention(b, window, fp8, nsplit, Hq, Hkv, 64);
        }
  // The tiny preset's shape: head_dim 32, 2 query heads per kv head.
  check_attention({{30, 3}}, 16, false, 2, 4, 2, 32);
}

// Two same-sized outputs compared bit for bit: how many elements differ.
size_t elements_differing(const std::vector<float>& a, const std::vector<float>& b) {
  size_t differ = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) differ += std::memcmp(&a[i], &b[i], 4) != 0;
  return differ;
}

// A decode attention case for failure messages.
std::string decode_case(const std::vector<AttnSeq>& b, int window, bool fp8, const cuda::DecodeAttentionPlan& plan) {
  return "seqs=" + std::to_string(b.size()) + " window=" + std::to_string(window) + " fp8=" + std::to_string(fp8) +
         " nsplit=" + std::to_string(plan.nsplit) + (plan.cluster ? " cluster" : " split");
}

// Decode batches for the fused kernel: one new token a sequence at positions around the 128-key
// window, the 32-key tiles and the pages (16 and 7 slots), 1, 7, 33 and 64 sequences of
// different lengths.
std::vector<std::vector<AttnSeq>> decode_batches() {
  std::vector<std::vector<AttnSeq>> b = {
      {{0, 1}},    // the first token: its own k/v only
      {{127, 1}},  // 128 keys: the whole window, 4 tiles
      {{160, 1}},  // window start mid-page, mid-tile
      {{5, 1}, {15, 1}, {16, 1}, {31, 1}, {128, 1}, {129, 1}, {700, 1}},  // 7 sequences
  };
  std::vector<AttnSeq> s33, s64;
  for (int i = 0; i < 33; ++i) s33.push_back({(i * 97 + 3) % 620, 1});
  for (int i = 0; i < 64; ++i) s64.push_back({i == 63 ? 2500 : (i * 53 + i * i) % 400, 1});
  b.push_back(s33);
  if (!small_mode()) b.push_back(s64);
  return b;
}

// attention_decode (RoPE + K/V store + attention in one kernel) against the CPU: every plan
// shape (a cluster of 1, 2, 4, 8 or 16 splits merged in the cluster; 1, 5 or 32 splits merged by the
// second launch; decode_attention_plan's choice), on CUDA cores and on tensor cores, bf16 and fp8
// KV, full and sliding layers, page sizes 16 and 7, the tiny preset's head_dim 32 with 2 query
// heads a kv head (the tensor-core plan falls back), and head_dim 64 with 4 query heads a kv head.
TEST_F(Kernels, AttentionDecodeFused) {
  const int Hq = small_mode() ? 8 : 64, Hkv = small_mode() ? 1 : 8;
  const std::vector<cuda::DecodeAttentionPlan> plans = {
      {1, true},        {2, true},       {4, true},        {8, true},        {16, true},      {1, false},
      {5, false},       {32, false},     {1, true, true},  {2, true, true},  {8, true, true}, {16, true, true},
      {1, false, true}, {5, false, true}, {32, false, true}};
  int k = 0;
  for (auto& b : decode_batches())
    for (int window : {0, 128})
      for (bool fp8 : {false, true}) {
        int max_keys = 0;
        for (auto& q : b) max_keys = std::max(max_keys, window ? std::min(q.start + 1, window) : q.start + 1);
        std::vector<cuda::DecodeAttentionPlan> these = {
            cuda::decode_attention_plan(int(b.size()), Hkv, max_keys, 32)};
        // Every plan on the small batches; two more, in turn, on the big ones (CPU time).
        if (b.size() <= 7)
          these.insert(these.end(), plans.begin(), plans.end());
        else
          for (int i = 0; i < 2; ++i) these.push_back(plans[k++ % plans.size()]);
        for (const auto& plan : these) {
          AttnRun run;
          run.page_size = (k++ % 2) ? 7 : 16;
          run.fused = true;
          run.plan = plan;
          check_attention(b, window, fp8, 1, Hq, Hkv, 64, run);
        }
      }
  AttnRun tiny;
  tiny.fused = true;
  for (auto plan : {cuda::DecodeAttentionPlan{1, true}, cuda::DecodeAttentionPlan{4, true},
                    cuda::DecodeAttentionPlan{3, false}, cuda::DecodeAttentionPlan{2, true, true}}) {
    tiny.plan = plan;
    check_attention({{30, 1}, {3, 1}, {17, 1}}, 16, false, 1, 4, 2, 32, tiny);
    check_attention({{40, 1}, {0, 1}}, 0, true, 1, 4, 2, 32, tiny);
  }
  // The tensor-core kernel with fewer query heads than its 8 rows (the tiny fixture's 4 a kv head).
  for (auto plan : {cuda::DecodeAttentionPlan{1, true, true}, cuda::DecodeAttentionPlan{4, true, true},
                    cuda::DecodeAttentionPlan{3, false, true}, cuda::DecodeAttentionPlan{1, false, true}}) {
    tiny.plan = plan;
    check_attention({{130, 1}, {3, 1}, {64, 1}, {63, 1}}, 128, false, 1, 4, 1, 64, tiny);
    check_attention({{200, 1}, {0, 1}}, 0, true, 1, 8, 2, 64, tiny);
  }
}

// attention_decode's stored mode (rope_kv_store first; graphed speculative verify passes) against
// the CPU: sequences of 1-8 tokens in one pass, crossing 64-key tiles, pages (16 and 7 slots) and
// the 128-key window, bf16 and fp8 KV, cluster and split plans on tensor cores, and a plan without
// them (attention()'s per-token kernel).
TEST_F(Kernels, AttentionDecodeStored) {
  const int Hq = small_mode() ? 8 : 64, Hkv = small_mode() ? 1 : 8;
  std::vector<std::vector<AttnSeq>> batches = {
      {{0, 4}},                                    // the first tokens, all in this pass
      {{127, 3}, {5, 2}, {700, 5}},                // around the window and a long context
      {{60, 8}, {0, 1}, {31, 3}, {128, 2}},        // a 64-key tile edge inside one sequence's run
  };
  std::vector<AttnSeq> verify16;  // 16 sequences x (1 + 3 drafts), as a K = 3 verify pass
  for (int i = 0; i < 16; ++i) verify16.push_back({(i * 131 + 7) % 900, 4});
  batches.push_back(verify16);
  const std::vector<cuda::DecodeAttentionPlan> fixed = {{1, true, true}, {4, true, true}, {5, false, true},
                                                       {2, true, false}};
  int k = 0;
  for (auto& b : batches)
    for (int window : {0, 128})
      for (bool fp8 : {false, true}) {
        int max_keys = 0, n = 0;
        for (auto& q : b) {
          const int last = q.start + q.n;
          max_keys = std::max(max_keys, window ? std::min(last, window) : last);
          n += q.n;
        }
        std::vector<cuda::DecodeAttentionPlan> these = {cuda::decode_attention_plan(n, Hkv, max_keys, 32),
                                                        fixed[k++ % fixed.size()]};
        for (const auto& plan : these) {
          AttnRun run;
          run.page_size = (k++ % 2) ? 7 : 16;
          run.fused = true;
          run.kv_stored = true;
          run.plan = plan;
          check_attention(b, window, fp8, 1, Hq, Hkv, 64, run);
        }
      }
}

// On passes of one token a sequence, the stored mode (rope_kv_store, then attention_decode reading
// every key from the pages) gives the fused mode's bits: the same pages after the pass and the same
// output, for cluster and split plans, bf16 and fp8 KV, full and sliding layers. (Batches up to 33
// sequences: a bit-for-bit comparison needs no more, and the suite's time matters.)
TEST_F(Kernels, AttentionDecodeStoredMatchesFused) {
  const int Hq = small_mode() ? 8 : 64, Hkv = small_mode() ? 1 : 8;
  const uint64_t seed = fresh_seed() | 1;
  for (auto& b : decode_batches())
    for (int window : {0, 128})
      for (bool fp8 : {false, true})
        for (auto plan : {cuda::DecodeAttentionPlan{2, true, true}, cuda::DecodeAttentionPlan{5, false, true}}) {
          if (b.size() > 33) continue;
          std::vector<uint8_t> pool_fused, pool_stored;
          AttnRun fused{.path = cuda::AttentionPath::kPerToken, .page_size = 16, .seed = seed};
          fused.cpu_reference = false;  // both meet the CPU in AttentionDecodeFused / AttentionDecodeStored
          fused.fused = true;
          fused.plan = plan;
          fused.pool_after = &pool_fused;
          AttnRun stored = fused;
          stored.kv_stored = true;
          stored.pool_after = &pool_stored;
          auto f = check_attention(b, window, fp8, plan.nsplit, Hq, Hkv, 64, fused);
          auto g = check_attention(b, window, fp8, plan.nsplit, Hq, Hkv, 64, stored);
          const std::string at = decode_case(b, window, fp8, plan);
          ASSERT_EQ(f.size(), g.size()) << at;
          EXPECT_EQ(elements_differing(f, g), 0u) << at << ": output elements differing";
          EXPECT_TRUE(pool_fused == pool_stored) << at << ": KV pages differ";
        }
}

// The decode plan (host only, runs without a GPU): a cluster of a power-of-two splits up to 8
// within one wave of blocks (528) unless a split would walk more than 8 tiles of 32 keys and the
// backend's split-and-merge count is larger; a plan never depends on the context otherwise (a
// captured graph serves every step until the context crosses that line).
TEST(DecodeAttentionPlan, ClustersWithinAWaveSplitsForLongContexts) {
  for (int Hkv : {1, 4, 8})
    for (int n = 1; n <= 64; ++n) {
      const int split = std::clamp((264 + n * Hkv - 1) / (n * Hkv), 1, 32);  // CudaBackend::splits_for
      const cuda::DecodeAttentionPlan shortp = cuda::decode_attention_plan(n, Hkv, 100, split, 8, false);
      const std::string at = "n=" + std::to_string(n) + " Hkv=" + std::to_string(Hkv);
      ASSERT_TRUE(shortp.cluster) << at;
      EXPECT_EQ(shortp.nsplit & (shortp.nsplit - 1), 0) << at;
      EXPECT_LE(shortp.nsplit, 8) << at;
      EXPECT_TRUE(shortp.nsplit == 1 || n * Hkv * shortp.nsplit <= 528) << at;
      EXPECT_TRUE(shortp.nsplit == 8 || n * Hkv * shortp.nsplit * 2 > 528) << at << ": room for more splits";
      for (int keys : {1, 128, 576, 2048, 4096, 32768, 131072}) {
        const cuda::DecodeAttentionPlan p = cuda::decode_attention_plan(n, Hkv, keys, split, 8, false);
        const int tiles = (keys + 31) / 32;
        if (p.cluster) {
          EXPECT_EQ(p.nsplit, shortp.nsplit) << at << " keys=" << keys;
          EXPECT_TRUE((tiles + p.nsplit - 1) / p.nsplit <= 8 || split <= p.nsplit) << at << " keys=" << keys;
        } else {
          EXPECT_EQ(p.nsplit, split) << at << " keys=" << keys;
          EXPECT_GT(split, shortp.nsplit) << at << " keys=" << keys;
          EXPECT_GT((tiles + shortp.nsplit - 1) / shortp.nsplit, 8) << at << " keys=" << keys;
        }
      }
    }
  // gpt-oss at one sequence: 8 splits in a cluster at short context, 32 through the merge kernel
  // past 2048 keys.
  EXPECT_TRUE(cuda::decode_attention_plan(1, 8, 576, 32, 8, false).cluster);
  EXPECT_EQ(cuda::decode_attention_plan(1, 8, 576, 32, 8, false).nsplit, 8);
  EXPECT_FALSE(cuda::decode_attention_plan(1, 8, 4096, 32, 8, false).cluster);
}

// The tensor-core kernel's plan (host only): always plan.mma; one split up to 3 tiles of 64 keys
// (the sliding layers), on the kernel without the cluster merge; clusters of a power of two, at
// most one split a tile and within a wave; split-and-merge for long contexts or where a cluster
// grid would not fit. The gpt-oss choices
// measured best on the H200.
TEST(DecodeAttentionPlan, TensorCorePlan) {
  auto plan = [](int n, int keys) {
    const int split = std::clamp((264 + n * 8 - 1) / (n * 8), 1, 32);  // CudaBackend::splits_for
    return cuda::decode_attention_plan(n, 8, keys, split);
  };
  for (int n = 1; n <= 64; ++n)
    for (int keys : {1, 64, 128, 192, 256, 512, 2048, 4096, 32768, 131072}) {
      const cuda::DecodeAttentionPlan p = plan(n, keys);
      const std::string at = "n=" + std::to_string(n) + " keys=" + std::to_string(keys);
      EXPECT_TRUE(p.mma) << at;
      EXPECT_GE(p.nsplit, 1) << at;
      EXPECT_LE(p.nsplit, 32) << at;
      if (keys <= 192) { EXPECT_EQ(p.nsplit, 1) << at; }
      if (p.cluster) {
        EXPECT_EQ(p.nsplit & (p.nsplit - 1), 0) << at;
        EXPECT_LE(p.nsplit, 8) << at;
        EXPECT_LE(p.nsplit, (keys + 63) / 64) << at;
        EXPECT_TRUE(n * 8 * p.nsplit <= 396) << at;  // three blocks an SM
        EXPECT_GT(p.nsplit, 1) << at << ": one split takes the kernel without the cluster merge";
      }
    }
  auto same = [](cuda::DecodeAttentionPlan p, int nsplit, bool cluster) {
    return p.nsplit == nsplit && p.cluster == cluster;
  };
  EXPECT_TRUE(same(plan(1, 128), 1, false));   // sliding layer: one split, no cluster
  EXPECT_TRUE(same(plan(1, 512), 8, true));    // a split a tile
  EXPECT_TRUE(same(plan(1, 4096), 32, false)); // long: 32 splits and the merge launch
  EXPECT_TRUE(same(plan(8, 512), 4, true));    // clusters of 8 would not fit a wave whole
  EXPECT_TRUE(same(plan(24, 512), 2, true));
  EXPECT_TRUE(same(plan(32, 512), 2, false));  // a cluster of 2 would not fit a wave: split and merge
  EXPECT_TRUE(same(plan(32, 4096), 2, false));
  EXPECT_TRUE(same(plan(64, 512), 1, false));  // 512 blocks, four an SM: one wave
  EXPECT_TRUE(same(plan(64, 4096), 1, false));
}

// The fused kernel against rope_kv_store + attention with the same splits: the same output bits
// and the same K/V bytes in the pages (both round k and v the same way and share the split
// boundaries, the per-tile arithmetic and the merge code, the cluster merge included). The
// tensor-core kernel stores the same K/V bytes and gives outputs within bf16 output rounding of
// theirs (its P is two bf16 parts, ~16 bits).
TEST_F(Kernels, AttentionDecodeFusedMatchesTwoKernels) {
  const int Hq = small_mode() ? 8 : 64, Hkv = small_mode() ? 1 : 8;
  const uint64_t seed = fresh_seed() | 1;
  for (auto& b : decode_batches())
    for (int window : {0, 128})
      for (bool fp8 : {false, true})
        for (auto plan : {cuda::DecodeAttentionPlan{1, true}, cuda::DecodeAttentionPlan{8, true},
                          cuda::DecodeAttentionPlan{16, true}, cuda::DecodeAttentionPlan{5, false},
                          cuda::DecodeAttentionPlan{2, true, true}, cuda::DecodeAttentionPlan{5, false, true}}) {
          std::vector<uint8_t> pool_two, pool_fused;
          AttnRun two{.path = cuda::AttentionPath::kPerToken, .page_size = 16, .seed = seed};
          two.pool_after = &pool_two;
          // Both paths meet the CPU in AttentionPaged and AttentionDecodeFused; here they meet
          // each other (H200: 155 s with the CPU reference, 102 s without).
          two.cpu_reference = false;
          AttnRun fused = two;
          fused.fused = true;
          fused.plan = plan;
          fused.pool_after = &pool_fused;
          auto a = check_attention(b, window, fp8, plan.nsplit, Hq, Hkv, 64, two);
          auto f = check_attention(b, window, fp8, plan.nsplit, Hq, Hkv, 64, fused);
          const std::string at = decode_case(b, window, fp8, plan);
          ASSERT_EQ(a.size(), f.size()) << at;
          if (plan.mma) {  // other sums (tensor cores, P in two bf16 parts): within bf16 output rounding
            const double e = rel_err(f, a);
            std::printf("attention decode mma vs CUDA cores, %s: rel err %.3g\n", at.c_str(), e);
            EXPECT_LE(e, 2e-3) << at << " mma";
          } else {
            EXPECT_EQ(elements_differing(a, f), 0u) << at << ": output elements differing";
          }
          EXPECT_TRUE(pool_two == pool_fused) << at << ": KV pages differ";
        }
}

// The tensor-core flash kernel (AttentionPath::kFlash) against the CPU reference: prompt lengths
// around its 16-token / 64-key tiles, with and without a cached prefix, windows crossing tiles and
// pages, page sizes 16, 32 and 7, bf16 and fp8 KV, several sequences a pass, GQA groups 8, 4, 2, 1.
TEST_F(Kernels, FlashAttentionPrefill) {
  ASSERT_TRUE(cuda::flash_attention_supported(64, 8, 64));
  const int Hq = small_mode() ? 8 : 64, Hkv = small_mode() ? 1 : 8;
  const int page_sizes[] = {16, 32, 7};
  int k = 0;
  for (int n : {1, 63, 64, 65, 127, 128, 129, 300})
    for (int start : {0, 37, 200})
      for (int window : {0, 128})
        for (bool fp8 : {false, true}) {
          AttnRun run{.path = cuda::AttentionPath::kFlash, .page_size = page_sizes[k++ % 3], .seed = 0};
          check_attention({{start, n}}, window, fp8, 1, Hq, Hkv, 64, run);
        }
  std::vector<std::vector<AttnSeq>> batches = {
      {{0, 65}, {300, 129}, {5, 1}, {0, 16}},  // mixed lengths, one decode token between
      {{2000, 48}, {0, 300}, {130, 17}},       // long prefix, window far behind
      {{0, 1}, {1, 1}, {2, 1}},                // decode-only pass through the flash kernel
  };
  for (auto& b : batches)
    for (int ps : {16, 32, 7})
      for (int window : {0, 128})
        for (bool fp8 : {false, true})
          check_attention(b, window, fp8, 1, Hq, Hkv, 64, AttnRun{.path = cuda::AttentionPath::kFlash, .page_size = ps, .seed = 0});
  if (!small_mode())
    for (int window : {0, 128})
      for (bool fp8 : {false, true}) {
        check_attention({{0, 2048}}, window, fp8, 1, Hq, Hkv, 64, AttnRun{.path = cuda::AttentionPath::kFlash, .page_size = 16, .seed = 0});
        check_attention({{2048, 300}}, window, fp8, 1, Hq, Hkv, 64, AttnRun{.path = cuda::AttentionPath::kFlash, .page_size = 32, .seed = 0});
      }
  // Other GQA groups: 4, 2 and 1 query heads a kv head (16, 32 and 128 tokens a CTA).
  for (auto [hq, hkv] : {std::pair{16, 4}, std::pair{8, 4}, std::pair{4, 4}})
    for (int window : {0, 128}) {
      check_attention({{0, 200}, {50, 70}}, window, false, 1, hq, hkv, 64, AttnRun{.path = cuda::AttentionPath::kFlash, .page_size = 16, .seed = 0});
      check_attention({{130, 129}}, window, true, 1, hq, hkv, 64, AttnRun{.path = cuda::AttentionPath::kFlash, .page_size = 7, .seed = 0});
    }
  EXPECT_FALSE(cuda::flash_attention_supported(64, 8, 32));
  EXPECT_FALSE(cuda::flash_attention_supported(48, 8, 64));  // 6 heads a group
}

// kAuto on a pass mixing prefill chunks and decode tokens: the flash kernel takes the 16-token
// blocks of at most two sequences, the per-token kernel (with KV splits) and its merge the others
// (flash_blocks.cuh); every token must come out right, whichever kernel took it.
TEST_F(Kernels, FlashAttentionMixedPass) {
  const int Hq = small_mode() ? 8 : 64, Hkv = small_mode() ? 1 : 8;
  std::vector<AttnSeq> decode_heavy = {{100, 40}};
  for (int i = 0; i < 20; ++i) decode_heavy.push_back({50 + 37 * i, 1});
  decode_heavy.push_back({0, 70});
  // A serving pass's shape: decode tokens first, then prompt chunks (the per-token range at the
  // front); decode tokens between and after prompts (two ranges apart: the per-token launch covers
  // the flash blocks between, which return).
  std::vector<AttnSeq> serve_like;
  for (int i = 0; i < 7; ++i) serve_like.push_back({40 + 11 * i, 1});
  for (int i = 0; i < 3; ++i) serve_like.push_back({0, 100 + 13 * i});
  std::vector<AttnSeq> scattered = {{0, 70}, {9, 1}, {30, 1}, {12, 1}, {0, 90}, {200, 40}, {3, 1}, {77, 1}, {5, 1}};
  const std::vector<std::vector<AttnSeq>> batches = {
      {{0, 65}, {300, 129}, {5, 1}, {0, 16}},  // block 192..207 holds 3 sequences: per-token
      decode_heavy, serve_like, scattered,
      {{0, 65}, {300, 129}, {0, 16}},  // every sequence >= 16 tokens: the flash kernel alone
  };
  for (auto& b : batches) {
    int most = 0, fewest = 1 << 30;
    std::vector<int> seq_tokens;
    for (auto& q : b) {
      most = std::max(most, q.n);
      fewest = std::min(fewest, q.n);
      seq_tokens.push_back(q.n);
    }
    for (int window : {0, 128})
      for (bool fp8 : {false, true})
        for (int nsplit : {1, 5})
          // Without the sequences' token counts (the per-token launch over every token) and with
          // them (over the range attention_per_token_range gives).
          for (bool counts : {false, true})
            check_attention(b, window, fp8, nsplit, Hq, Hkv, 64,
                            AttnRun{.path = cuda::AttentionPath::kAuto, .page_size = 16, .seed = 0,
                                    .info = {int(b.size()), most, fewest, counts ? seq_tokens : std::vector<int>{}}});
  }
}

// The per-token kernel's range against flash_takes_block's rule applied token by token: every
// block of more than kFlashMaxRuns (2) sequences lies inside it, and it starts and ends at such
// blocks.
TEST(AttentionPerTokenRange, CoversTheBlocksTheFlashKernelLeaves) {
  FastRng r(fresh_seed());
  for (int trial = 0; trial < 2000; ++trial) {
    const int tq = trial % 3 == 0 ? 16 : 1 + int(r.next() % 40);
    std::vector<int> seq_tokens;
    std::vector<int> seq_of;  // sequence of each pass row
    const int seqs = 1 + int(r.next() % 12);
    for (int i = 0; i < seqs; ++i) {
      const int kind = int(r.next() % 4);  // decode tokens, short and long chunks, now and then empty
      const int c = kind == 0 ? 1 : kind == 1 ? int(r.next() % 20) : int(r.next() % 200);
      seq_tokens.push_back(c);
      seq_of.insert(seq_of.end(), size_t(c), i);
    }
    const int n = int(seq_of.size());
    const cuda::TokenRange got = cuda::attention_per_token_range(seq_tokens, n, tq);
    int first = n, end = 0;
    for (int t0 = 0; t0 < n; t0 += tq) {
      int runs = 1;
      for (int t = t0 + 1; t < std::min(n, t0 + tq); ++t) runs += seq_of[size_t(t)] != seq_of[size_t(t - 1)];
      if (runs > 2) first = std::min(first, t0), end = std::min(n, t0 + tq);
    }
    if (first >= end) {
      // No such block: nothing for the per-token kernel (or, with empty sequences, a range it
      // covers without need: the kernel's blocks still check).
      EXPECT_LE(got.begin, got.end);
      continue;
    }
    EXPECT_LE(got.begin, first) << "trial " << trial;
    EXPECT_GE(got.end, end) << "trial " << trial;
    // Empty sequences are the only reason to reach further.
    if (std::find(seq_tokens.begin(), seq_tokens.end(), 0) == seq_tokens.end()) {
      EXPECT_EQ(got.begin, first) << "trial " << trial;
      EXPECT_EQ(got.end, end) << "trial " << trial;
    }
  }
  // Unknown counts, or counts that do not add up to n: every token.
  EXPECT_EQ(cuda::attention_per_token_range({}, 50, 16).end, 50);
  EXPECT_EQ(cuda::attention_per_token_range({10, 10}, 50, 16).end, 50);
  EXPECT_EQ(cuda::attention_per_token_range({10, 10}, 50, 16).begin, 0);
  // Sequences of at least a block each: none.
  const cuda::TokenRange none = cuda::attention_per_token_range({16, 40, 16}, 72, 16);
  EXPECT_EQ(none.begin, none.end);
}

// Batch invariance of the flash kernel: a sequence's rows are bit-identical alone and batched
// with other sequences (its KV tiles are the fixed 64-aligned tiles of its own range; tiles a
// row does not see are exact no-ops), for prefill chunks and decode tokens.
TEST_F(Kernels, FlashAttentionBatchInvariant) {
  const int Hq = small_mode() ? 8 : 64, Hkv = small_mode() ? 1 : 8;
  const uint64_t seed = fresh_seed() | 1;
  for (int window : {0, 128})
    for (bool fp8 : {false, true}) {
      AttnRun run{.path = cuda::AttentionPath::kFlash, .page_size = 16, .seed = seed};
      const AttnSeq a{150, 70}, d{300, 1};
      auto alone_a = check_attention({a}, window, fp8, 1, Hq, Hkv, 64, run);
      auto alone_d = check_attention({d}, window, fp8, 1, Hq, Hkv, 64, run);
      // Batched: a behind 5 tokens of another sequence (its tiles shift within the CTAs), d
      // among other decode tokens.
      auto batched = check_attention({{0, 5}, a, {7, 1}, d, {999, 3}}, window, fp8, 1, Hq, Hkv, 64, run);
      const size_t row = size_t(Hq) * 64;
      ASSERT_EQ(batched.size(), (5 + 70 + 1 + 1 + 3) * row);
      for (size_t i = 0; i < alone_a.size(); ++i)
        ASSERT_EQ(alone_a[i], batched[5 * row + i]) << "prefill row element " << i << " window " << window;
      for (size_t i = 0; i < alone_d.size(); ++i)
        ASSERT_EQ(alone_d[i], batched[76 * row + i]) << "decode row element " << i << " window " << window;
    }
}

}  // namespace
}  // namespace gptoss
