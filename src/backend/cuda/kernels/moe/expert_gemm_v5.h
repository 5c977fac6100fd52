#pragma once
// Version 5 of the prefill expert GEMM (expert_gemm_wgmma_wa.cu; the choices below are made in
// expert_gemm_v5_choice.cpp): its CTA shape, hand-off and tiling, beside the width (kernels.h).
// Apart from kernels.h so a knob of one kernel does not rebuild the backend.

namespace gptoss::cuda {

// Warpgroups a version 5 CTA: 2 (128 weight rows, two CTAs an SM) or 4 (256 weight rows sharing
// each activation tile, one CTA an SM), or 0: automatic (expert_gemm_v5_auto_warpgroups).
// GPTOSS_EXPERT_GEMM_V5_WG (read once) or set_expert_gemm_v5_warpgroups (tests, bench; -1 = back
// to the environment's value).
int expert_gemm_v5_warpgroups();
void set_expert_gemm_v5_warpgroups(int wgs);
// The automatic choice for a launch of `pairs` sorted pairs in tiles of tile_pairs: 4 from 64-pair
// tiles and 8192 pairs up (H200, s24r1-r2: faster there at every size measured), else 2 (narrow
// tiles lost 2-5% with 4, and launches under 8192 pairs 1-2% in the model).
int expert_gemm_v5_auto_warpgroups(int tile_pairs, int pairs);
// What a launch runs: the override where one is set, else the automatic choice.
int expert_gemm_v5_chosen_warpgroups(int tile_pairs, int pairs);
// How a launch of 128-pair tiles with four warpgroups over activations already in the fragment K
// order hands each step's activation tile between its warpgroups: mbarriers (true, the default:
// no block barrier a step; the automatic width then counts a 128-pair tile cheaper) or a block
// barrier a step (false; every other launch takes the block barrier). GPTOSS_EXPERT_GEMM_V5_MBAR=0|1 (read once)
// or set_expert_gemm_v5_mbarriers (tests, bench; -1 = back to the environment's value).
bool expert_gemm_v5_mbarriers();
void set_expert_gemm_v5_mbarriers(int on);
// Whether a launch of `pairs` sorted pairs in tiles of tile_pairs takes the mbarrier hand-off
// (the launcher, the automatic width and bench-kernels' row names all ask this).
bool expert_gemm_v5_uses_mbarriers(int tile_pairs, int pairs, bool a_k_permuted);
// Whether a launch that takes the mbarrier hand-off runs the warp-specialized kernel instead
// (expert_gemm_v5_ws.cu: a producer warp makes every copy, bulk copies of the weights and the
// activation rows by tensor copies (1) or by cp.async (2); the 16 other warps only decode and
// multiply), or not (0). Opt-in while it is measured: GPTOSS_EXPERT_GEMM_V5_WS=0|1|2 (read once,
// default 0) or set_expert_gemm_v5_warp_specialized (tests, bench; -1 = back to the environment's value).
int expert_gemm_v5_warp_specialized();
void set_expert_gemm_v5_warp_specialized(int mode);

// Split tiling: an expert's pairs in n / bulk whole tiles of `bulk` pairs, and its remainder, where
// it holds at most `rem` pairs, in one tile of `rem` pairs launched right after (rem 0: one launch,
// ceil(n / bulk) tiles). The padding of a partly filled last tile is what the remainder launch
// saves: at 120b's 4096 tokens (~128 pairs an expert) half the experts' second 128-pair tile holds
// under 32 pairs.
struct V5Tiling {
  int bulk = 64, rem = 0;
};
// The automatic choice by the tile cost model (expert_gemm_v5_auto_tile_pairs's, a remainder tile
// costed as measured): a split of the 128-pair mbarrier kernel where it saves at least 2% of the
// expected cost, else one width (GPTOSS_EXPERT_GEMM_V5_SPLIT=0: always one width).
V5Tiling expert_gemm_v5_auto_tiling(int pairs, int E);
// What a launch runs: set_expert_gemm_v5_split's forced tiling, else a forced width (one launch),
// else the automatic tiling (one width if GPTOSS_EXPERT_GEMM_V5_SPLIT=0).
V5Tiling expert_gemm_v5_tiling(int pairs, int E);
bool expert_gemm_v5_split();
// Tests: force bulk + rem (rem 0: one width); bulk -1: back to the environment and the automatic choice.
void set_expert_gemm_v5_split(int bulk, int rem);

}  // namespace gptoss::cuda
