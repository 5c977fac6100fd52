// The MoE expert kernels (kernels/moe, the grouped decode kernels of kernels/linear) against the CPU
// reference: routing, gate_up with SwiGLU and down with the weighted scatter, at 120b and 20b
// shapes, every batch regime (1-64 tokens, prefill) and awkward groups (experts with 0, 1, 63, 65
// and thousands of pairs).

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/moe/expert_gemm_v5.h"

#include "kernel_test_fixture.h"

namespace gptoss {
namespace {

using namespace gptoss::test;
using cuda::Epilogue;
using cuda::WeightMat;

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
// fragment layout at real and awkward shapes, against the CPU, with the 128-pair tiles' copies made
// `ws` ways: 0 each warp its own (mbarriers) or a block barrier, at every width; 1 and 2 a producer
// warp's, warp-specialized (tensor copies / cp.async), at 128 pairs on four warpgroups only. Both
// alone and in split tilings (whole tiles of `bulk` pairs, remainders of at most `rem` in a second
// launch), forced, each CTA shape as the automatic rules pick it: groups wholly in the remainder
// launch, wholly in the bulk one, and cut between them (2049 tokens over 32 experts: ~256 pairs
// each, bulk 128 on four warpgroups with mbarriers). One test a mode, so each runs in a process of
// its own on the GPU rounds: a kernel that faults poisons its context for every test after it.
void check_expert_gemm_v5(int ws) {
  if (!cuda::expert_gemm_v3_available()) GTEST_SKIP() << "expert GEMM v5 needs sm_90a (Hopper)";
  std::vector<MoeCase> cases = {{1, 128, 4, 2880, 2880}, {33, 128, 4, 2880, 2880}, {129, 32, 4, 2880, 2880},
                                {2049, 32, 4, 256, 256},  {600, 128, 4, 2880, 2880}, {7, 8, 2, 64, 64}};
  if (small_mode()) cases = {{1, 8, 2, 64, 64}, {33, 8, 4, 128, 64}, {100, 8, 4, 64, 128}};
  const char* ws_name[] = {"", ", warp-specialized, tensor copies", ", warp-specialized, cp.async"};
  cuda::set_expert_gemm_version(5);
  cuda::set_expert_gemm_v5_warp_specialized(ws);
  for (int wgs : {2, 4})  // CTAs of 128 and of 256 weight rows
    for (int pairs : {32, 48, 64, 80, 96, 128})
      for (int mbar : {1, 0}) {  // permuted activations handed over by mbarriers (128 pairs) or a block barrier
        if (mbar && (pairs != 128 || wgs != 4)) continue;  // (the others always take the block barrier)
        if (ws && !mbar) continue;                         // (only the mbarrier tiles are warp-specialized)
        cuda::set_expert_gemm_v5_warpgroups(wgs);
        cuda::set_expert_gemm_v5_tile_pairs(pairs);
        cuda::set_expert_gemm_v5_mbarriers(mbar);
        SCOPED_TRACE("v5 tile pairs " + std::to_string(pairs) + ", " + std::to_string(wgs) + " warpgroups, " +
                     (mbar ? "mbarriers" : "block barrier") + ws_name[ws]);
        for (auto& c : cases)
          if (c.n > cuda::kSkinnyMaxTokens)
            for (int path : {3, 4})  // transposed in the kernel (block barrier always); handed over permuted
              if (path == 4 || !mbar) check_moe(c, path);
      }
  cuda::set_expert_gemm_v5_mbarriers(-1);
  cuda::set_expert_gemm_v5_warpgroups(-1);
  cuda::set_expert_gemm_v5_tile_pairs(-1);
  for (const auto& [bulk, rem] : {std::pair{48, 32}, {128, 32}, {128, 96}, {80, 64}}) {
    if (ws && bulk != 128) continue;
    cuda::set_expert_gemm_v5_split(bulk, rem);
    SCOPED_TRACE("v5 split tiling " + std::to_string(bulk) + " + " + std::to_string(rem) + ws_name[ws]);
    EXPECT_EQ(cuda::expert_gemm_v5_tiling(4096, 128).rem, rem);
    for (auto& c : cases)
      if (c.n > cuda::kSkinnyMaxTokens) check_moe(c, 4);
  }
  cuda::set_expert_gemm_v5_warp_specialized(-1);
  cuda::set_expert_gemm_v5_split(-1, 0);
  cuda::set_expert_gemm_version(0);
}

TEST_F(Kernels, MoeMxfp4ExpertGemmV5) { check_expert_gemm_v5(0); }
TEST_F(Kernels, MoeMxfp4ExpertGemmV5WarpSpecializedTma) { check_expert_gemm_v5(1); }
TEST_F(Kernels, MoeMxfp4ExpertGemmV5WarpSpecializedCpAsync) { check_expert_gemm_v5(2); }

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

}  // namespace
}  // namespace gptoss
