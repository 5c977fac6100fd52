// The decode router, its folds into o_proj and the MoE combine (kernels/moe) against the CPU norm,
// GEMV, top-k and weighted sum, and against the older kernels they replaced.

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/kernels.h"

#include "kernel_test_fixture.h"

namespace gptoss {
namespace {

using namespace gptoss::test;
using cuda::Epilogue;
using cuda::WeightMat;

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

}  // namespace
}  // namespace gptoss
