// Version 5 of the prefill expert GEMM (expert_gemm_wgmma_wa.cu): what a launch runs, chosen on
// the host. The tile width (pairs a tile, by the expected decode work), the CTA shape (two or four
// warpgroups), the activation hand-off (block barrier or mbarriers) and the split tiling (whole
// tiles and a second launch for the remainders), each with its environment override and test
// setter, and the cost model behind the automatic choices. The kernels and their launchers stay
// in the .cu file; this is plain host code.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/moe/expert_gemm_v5.h"

namespace gptoss::cuda {

int g_v5_pairs = -1;  // expert_gemm_v5_tile_pairs: -1 not read yet, 0 auto, else the width

namespace {
// Version 5's tile widths (wgmma N; launch_v5 is instantiated for each, expert_gemm_v5 below) and
// what a tile of each costs against a 64-pair tile (expert_gemm_v5_auto_tile_pairs).
constexpr int kV5Widths[] = {32, 48, 64, 80, 96, 128};
constexpr double kV5TileCost[] = {0.725, 0.8625, 1.0, 1.15, 1.22, 1.6};
// A 128-pair tile with the mbarrier hand-off (expert_gemm_v5_mbarriers; s25r2, bench-kernels
// gate_up + down over the expected tile counts: 1.37x a 64-pair tile at 120b 2048 tokens, 1.41x
// at 8192, against 1.49-1.51x for the block barrier on the same run).
constexpr double kV5TileCost128Mbar = 1.4;
// What a split tiling's remainder tile costs beyond its width's kV5TileCost (s37r3: see
// expert_gemm_v5_auto_tiling).
constexpr double kV5RemainderTileExtra = 0.5;
bool v5_width_ok(int pairs) { return std::find(std::begin(kV5Widths), std::end(kV5Widths), pairs) != std::end(kV5Widths); }

// A switch read once from the environment into `cached` (-1: not read yet, as the setters below
// put it back), refused unless ok(value): "NAME: expected <expected>".
template <class Ok>
int env_switch(int& cached, const char* name, int dflt, Ok ok, const char* expected) {
  if (cached < 0) {
    const int v = env_int(name, dflt);
    if (!ok(v)) throw Error(std::string(name) + ": expected " + expected);
    cached = v;
  }
  return cached;
}
}  // namespace

int g_v5_wgs = -1;  // expert_gemm_v5_warpgroups: -1 not read yet, 0 auto, else 2 or 4

int expert_gemm_v5_warpgroups() {
  return env_switch(g_v5_wgs, "GPTOSS_EXPERT_GEMM_V5_WG", 0, [](int v) { return v == 0 || v == 2 || v == 4; },
                    "2, 4 or 0 (auto)");
}

void set_expert_gemm_v5_warpgroups(int wgs) {
  if (wgs != -1 && wgs != 0 && wgs != 2 && wgs != 4)
    throw Error("set_expert_gemm_v5_warpgroups: expected -1 (environment), 0 (auto), 2 or 4");
  g_v5_wgs = wgs;
}

int g_v5_mbar = -1;  // expert_gemm_v5_mbarriers: -1 not read yet, else 0 or 1

bool expert_gemm_v5_mbarriers() {
  return env_switch(g_v5_mbar, "GPTOSS_EXPERT_GEMM_V5_MBAR", 1, [](int v) { return v == 0 || v == 1; },
                    "0 (block barrier) or 1 (mbarriers)") != 0;
}

void set_expert_gemm_v5_mbarriers(int on) {
  if (on != -1 && on != 0 && on != 1) throw Error("set_expert_gemm_v5_mbarriers: expected -1 (environment), 0 or 1");
  g_v5_mbar = on;
}

int g_v5_ws = -1;  // expert_gemm_v5_warp_specialized: -1 not read yet, else 0, 1 or 2

int expert_gemm_v5_warp_specialized() {
  return env_switch(g_v5_ws, "GPTOSS_EXPERT_GEMM_V5_WS", 0, [](int v) { return v >= 0 && v <= 2; },
                    "0 (the mbarrier kernel), 1 (warp-specialized, tensor copies) or 2 (warp-specialized, cp.async)");
}

void set_expert_gemm_v5_warp_specialized(int mode) {
  if (mode < -1 || mode > 2) throw Error("set_expert_gemm_v5_warp_specialized: expected -1 (environment), 0, 1 or 2");
  g_v5_ws = mode;
}

int expert_gemm_v5_auto_warpgroups(int tile_pairs, int pairs) {
  // bench-kernels, gate_up + down a layer, two warpgroups -> four (H200, s24r1): 120b at 2048
  // tokens 80 pairs 1383 -> 1339 us, 96 1452 -> 1434, 64 1682 -> 1677; at 8192 96 pairs 4864 ->
  // 4554, 64 5823 -> 5173; 20b at 2048 96 pairs 1140 -> 1070, at 8192 4647 -> 4037. 32 and 48
  // pairs lost (120b 2048: 2240 -> 2361, 1963 -> 2070): a narrow tile's step is short, and one
  // CTA an SM in lockstep leaves its tensor cores idle more than two that drift apart. In the
  // model (s24r2, gptoss bench pp) four gained from 8192 pairs (2048 tokens: 120b +1.5%, 20b
  // +1.2-2.2%; 8192 tokens +3.2% / +5.4%) and lost below (20b pp512 -1.9%, pp1024 -1.6%: half as
  // many CTAs, so the last wave's tail weighs more).
  return tile_pairs >= 64 && pairs >= 8192 ? 4 : 2;
}

int expert_gemm_v5_chosen_warpgroups(int tile_pairs, int pairs) {
  const int wgs = expert_gemm_v5_warpgroups();
  return wgs ? wgs : expert_gemm_v5_auto_warpgroups(tile_pairs, pairs);
}

bool expert_gemm_v5_uses_mbarriers(int tile_pairs, int pairs, bool a_k_permuted) {
  // 128-pair tiles with four warpgroups only: there (one A buffer: a warpgroup decodes after its
  // MMAs, and one CTA an SM) the mbarrier hand-off measured 6-9% faster; at 32-96 pairs (two A
  // buffers) 1-14% slower (s25r2); with two warpgroups (two CTAs an SM, which drift apart anyway)
  // 20b pp1024 lost 3.5% (s25r3). Natural-order rows are transposed behind the block barrier.
  return a_k_permuted && tile_pairs == 128 && expert_gemm_v5_mbarriers() &&
         expert_gemm_v5_chosen_warpgroups(tile_pairs, pairs) == 4;
}

int expert_gemm_v5_tile_pairs() {
  return env_switch(g_v5_pairs, "GPTOSS_EXPERT_GEMM_V5_N", 0, [](int v) { return v == 0 || v5_width_ok(v); },
                    "32, 48, 64, 80, 96, 128 or 0 (auto)");
}

void set_expert_gemm_v5_tile_pairs(int pairs) {
  if (pairs != -1 && pairs != 0 && !v5_width_ok(pairs))
    throw Error("set_expert_gemm_v5_tile_pairs: expected -1 (environment), 0 (auto), 32, 48, 64, 80, 96 or 128");
  g_v5_pairs = pairs;
}

namespace {
// P(n) for n = 0 .. hi of a Poisson count with this mean (an expert's pairs under random routing).
std::vector<double> poisson_pmf(double mean, int hi) {
  std::vector<double> p(size_t(hi) + 1);
  for (int n = 0; n <= hi; ++n) p[size_t(n)] = std::exp(n * std::log(mean) - mean - std::lgamma(n + 1.0));
  return p;
}
}  // namespace

namespace {
// What the tile cost model says of a launch of `pairs` sorted pairs over E experts: the cheapest
// single width and the cheapest split tiling, each with its expected cost in 64-pair tiles an
// expert (an expert's pairs taken as Poisson around the mean, what random routing gives).
struct V5Choice {
  int width = 64;
  double width_cost = 0;
  V5Tiling split{64, 0};  // rem 0: no split considered (the 128-pair tile is not the mbarrier kernel)
  double split_cost = 0;
};

const V5Choice& v5_choice(int pairs, int E) {
  // Single widths: each tile costs kV5TileCost[width] of a 64-pair tile: the 80-128-pair costs
  // are what a tile took in bench-kernels (H200, s14r1, gate_up + down over the expected tile
  // counts at 2048 tokens: 80 pairs 1.13-1.17x a 64-pair tile, 96 1.21-1.24x, 128 1.59-1.62x),
  // the 32 and 48 ones that line extended (where every width is one tile a group, s14r3 measured
  // 0.86x and 0.92x: the tile's fixed cost weighs more when it is light). At every size measured
  // (120b and 20b, 256-8192 tokens) the choice was the fastest width or within 0.4%.
  //
  // Splits: B for n / B whole tiles and a narrower W for the remainder where it fits in W (a
  // second launch). At 120b's 4096 tokens (128 pairs an expert, 128-pair tiles) about half the
  // experts hold 128-160 pairs, whose second 128-pair tile is then a 32-pair one. Measured (H200,
  // s37r3, bench-kernels gate_up + down): a remainder tile costs ~0.5 more than the same width in
  // a launch of its own (1.19-1.31 units at 32 pairs against 0.725: each tile decodes its weights
  // whatever its width, and the second launch is small), so 120b at 4096 tokens 2523 -> 2400 us
  // (128 + 32, where the table alone promised 15%), 20b at 2048 1064 -> 1052; and splits of
  // narrower bulk widths lost (120b at 2048 tokens 80 + 64: 1405 -> 1467 us; 20b at 1024 128 + 32
  // on two warpgroups: 676 -> 726). So only the 128-pair mbarrier kernel is split.
  //
  // The sums take ~30-270 us of host time at 120b/20b prefill sizes, twice a layer: kept per
  // (pairs, E), which a server's chunk sizes repeat.
  thread_local std::unordered_map<uint64_t, V5Choice> chosen;
  // (the cheaper 128-pair tile only where it runs; the backend hands version 5 k-permuted rows)
  const bool mbar = expert_gemm_v5_uses_mbarriers(128, pairs, true);
  const uint64_t key = (uint64_t(uint32_t(pairs)) << 32) | (uint64_t(mbar) << 31) | uint32_t(E);
  if (const auto it = chosen.find(key); it != chosen.end()) return it->second;
  if (chosen.size() >= 4096) chosen.clear();
  const double mean = double(pairs) / std::min(pairs, E);
  const int hi = int(mean + 12 * std::sqrt(mean) + 16);
  const std::vector<double> p = poisson_pmf(mean, hi);
  auto tile_cost = [&](size_t i) { return kV5Widths[i] == 128 && mbar ? kV5TileCost128Mbar : kV5TileCost[i]; };
  V5Choice ch;
  for (size_t b = 0; b < std::size(kV5Widths); ++b) {
    const int B = kV5Widths[b];
    double tiles = 0;  // E[ceil(n / B)]
    for (int n = 1; n <= hi; ++n) tiles += p[size_t(n)] * ((n + B - 1) / B);
    const double cost = tiles * tile_cost(b);
    if (b == 0 || cost < ch.width_cost) ch.width_cost = cost, ch.width = B;
    if (B != 128 || !mbar) continue;
    for (size_t w = 0; w < b; ++w) {
      const int W = kV5Widths[w];
      double cs = 0;
      for (int n = 1; n <= hi; ++n) {
        const int rem = n % B;
        cs += p[size_t(n)] * ((n / B + (rem > W ? 1 : 0)) * tile_cost(b) +
                              (rem > 0 && rem <= W ? tile_cost(w) + kV5RemainderTileExtra : 0.0));
      }
      if (ch.split.rem == 0 || cs < ch.split_cost) ch.split_cost = cs, ch.split = {B, W};
    }
  }
  return chosen.emplace(key, ch).first->second;
}
}  // namespace

int expert_gemm_v5_auto_tile_pairs(int pairs, int E) {
  if (pairs <= 0 || E <= 0) return 64;
  return v5_choice(pairs, E).width;
}

int g_v5_split = -1;  // expert_gemm_v5_split: -1 not read yet, else 0 or 1
int g_v5_split_bulk = 0, g_v5_split_rem = 0;  // set_expert_gemm_v5_split's forced tiling (bulk 0: none)

bool expert_gemm_v5_split() {
  return env_switch(g_v5_split, "GPTOSS_EXPERT_GEMM_V5_SPLIT", 1, [](int v) { return v == 0 || v == 1; },
                    "0 (one width) or 1 (bulk + remainder)") != 0;
}

void set_expert_gemm_v5_split(int bulk, int rem) {
  if (bulk == -1) {  // back to the environment and the automatic choice
    g_v5_split = -1, g_v5_split_bulk = 0, g_v5_split_rem = 0;
    return;
  }
  if (!v5_width_ok(bulk) || (rem != 0 && (!v5_width_ok(rem) || rem >= bulk)))
    throw Error("set_expert_gemm_v5_split: widths of 32-128 pairs, the remainder's narrower than the bulk's");
  g_v5_split_bulk = bulk, g_v5_split_rem = rem;
}

V5Tiling expert_gemm_v5_auto_tiling(int pairs, int E) {
  if (pairs <= 0 || E <= 0) return {64, 0};
  const V5Choice& ch = v5_choice(pairs, E);
  // A second launch only where it saves at least 2% of the tiles' cost: 120b at 4096 and 8192
  // tokens, 20b at 2048 (s37r4, two runs each: 120b pp4096 +1.4%, pp8192 +1.7%, 20b pp2048 +1.3%).
  if (ch.split.rem > 0 && ch.split_cost < 0.98 * ch.width_cost) return ch.split;
  return {ch.width, 0};
}

V5Tiling expert_gemm_v5_tiling(int pairs, int E) {
  if (g_v5_split_bulk > 0) return {g_v5_split_bulk, g_v5_split_rem};
  if (const int w = expert_gemm_v5_tile_pairs(); w != 0) return {w, 0};
  if (!expert_gemm_v5_split()) return {expert_gemm_v5_auto_tile_pairs(pairs, E), 0};
  return expert_gemm_v5_auto_tiling(pairs, E);
}

bool expert_gemm_v5_preferred(int pairs, int E) {
  // H200, same binary (s13r1, bench-kernels gate_up + down a layer, fragment layout): 120b at 512
  // tokens (16 pairs an expert) 1500.86 us (v3) -> 1204.52 (v5, 64-pair tiles), at 2048 (64 pairs)
  // 2082.13 -> 1851.22; 20b at 2048 (256 pairs) 1596.49 -> 1315.12 (128-pair tiles). (The twelfth
  // session's model runs of 20b saw no gain because its prefill read the checkpoint-layout copy,
  // which version 5 does not take; CudaBackend::repack_weights now keeps the fragment layout alone
  // where version 5 runs.) So version 5 at every size it takes.
  return pairs > 0 && E > 0;
}

}  // namespace gptoss::cuda
