// The unit-walking grouped decode kernels: MXFP4 experts at 1-64 tokens (one n-tile: <= 8 of a
// group's tokens a pass), over a grid the size of the GPU. Two ways to split a unit among a
// block's warps: skinny_units_kernel (a K slice of every row tile a warp, the slices reduced
// through shared memory) and skinny_warp_units_kernel (whole row tiles a warp, no reduction).
// The per-chunk math is skinny_chunk.cuh's, shared with skinny_mma.cu, so each row's sums match
// the block-per-tile kernel's with the same split bit for bit.
#include "backend/cuda/kernels/linear/skinny_units.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>
#include <utility>

#include "backend/cuda/bulk_copy_ptx.cuh"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/diag_clocks.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/linear/frag_layout.cuh"
#include "backend/cuda/kernels/moe/router_fold.cuh"
#include "backend/cuda/tensor_core_ptx.cuh"

namespace gptoss::cuda {

namespace {

using namespace skinny;

// The experts' weights are read once a step and never again within it: past L1
// (ld.global.nc.L1::no_allocate, as bench-kernels' plain-read floors read them). Measured on the
// H200 (s39r4, paired runs, the same binary but this TU): 120b bf16 tg128 517.7 -> 519.7 tok/s at
// one sequence, 3612 -> 3628 at 64, 20b at 64 11251 -> 11331; the dense decode kernels
// (skinny_mma.cu) lost 1% the same way and keep __ldg.
constexpr WLoad kExpertWeightLoad = WLoad::kNoL1;

#ifdef GPTOSS_DIAG_UNITS_CLOCKS
// Diagnostic builds only (tools/gpu/diag_binary.sh): skinny_units_kernel's thread 0 adds the
// cycles between its stages to [kind][stage] (kind 0: gate_up after a folded router, 1: down after
// it, 2: any other launch), a count in [kind][7]; printed at exit. Stages: start -> the wait for
// the kernel before returned (griddepcontrol.wait, taken here ahead of the routing scan, which
// waits there otherwise) -> routing known -> the first unit's loop begins (first weights out, row
// staged) -> its chunks done -> the block's end (reductions, stores, later units).
__device__ unsigned long long g_units_clocks[3][8];
#define UNITS_CLOCK(i) GPTOSS_STAGE_CLOCK(uclk, i)
// The one-token fold's routing stage (->routed above) split, [gate_up, down][stage]: the sums'
// loads and gate_up's row copy issued, the sums in (keys made), top-k and softmax done, the block
// met.
__device__ unsigned long long g_fold_route_clocks[2][8];
void print_units_clocks() {
  static const char* const kinds[3] = {"gate_up (fold)", "down (fold)", "other"};
  static const char* const names[5] = {"start->waited", "->routed", "->loop begins", "first unit's chunks", "->end"};
  print_stage_table("units", g_units_clocks, kinds, names, 5);
  static const char* const rkinds[2] = {"gate_up", "down"};
  static const char* const rnames[4] = {"->issued", "->sums in", "->top-k", "->met"};
  print_stage_table("fold route (one token)", g_fold_route_clocks, rkinds, rnames, 4);
}
#else
#define UNITS_CLOCK(i) do {} while (0)
#endif

// The routing, read once a block with every group in one L2 round trip (the group arrays have an
// entry for each of the a.groups grid rows, so reading past ngroups is in bounds), and each
// group's first unit by a scan of its passes (<= PASS_TOKENS tokens each) times `tb` units a pass: s_unit0[i]
// (s_unit0[ngroups] = the total, returned), s_expert[i], s_start[i], s_end[i]. NWARPS * 32 threads,
// more than the groups. Waits for the previous kernel first unless the routing is settled.
template <int NWARPS, int PASS_TOKENS = 8>
__device__ __forceinline__ int scan_units(const SkinnyArgs& a, int tb, int* s_unit0, int* s_expert, int* s_start,
                                          int* s_end, int* s_warp_passes) {
  const int t = threadIdx.x, warp = t / 32, lane = t & 31;
  if (!a.r.settled) pdl_wait();
  const int ngroups = __ldcg(a.r.counts);
  int gs = 0, ge = 0, gx = 0;
  if (t < a.groups) {
    gs = __ldcg(a.r.group_start + t);
    ge = __ldcg(a.r.group_end + t);
    gx = __ldcg(a.r.group_expert + t);
  }
  const int passes = t < ngroups ? (ge - gs + PASS_TOKENS - 1) / PASS_TOKENS : 0;
  int incl = passes;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int y = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += y;
  }
  if (lane == 31) s_warp_passes[warp] = incl;
  __syncthreads();
  int total = 0;
#pragma unroll
  for (int w = 0; w < NWARPS; ++w) {
    const int c = s_warp_passes[w];
    if (w < warp) incl += c;
    total += c;
  }
  if (t < ngroups) {
    s_unit0[t] = (incl - passes) * tb;
    s_expert[t] = gx;
    s_start[t] = gs;
    s_end[t] = ge;
  }
  if (t == ngroups) s_unit0[t] = total * tb;
  __syncthreads();
  return total * tb;
}

// scan_units after a folded router (MoeRouting::fold, 1-8 tokens). One token: warp 0 routes from
// the fold's sums (after the wait unless settled) and the k selected experts become groups of one
// pair each, in expert order, one pass each; gate_up also starts its one row's copy here (every
// group's pair is token 0's row): the fold's x * norm_w into `scratch` (>= K floats of shared
// memory free until the first unit ends), in flight beside the routing's loads; stage_row_fold
// finishes it after the first weight loads are out. 2-8 tokens: warp t routes token t (the real
// ones: RouterFold::n_valid), then warp 0 sorts the pairs by expert, then token (moe_sort_warp's
// order), into groups of one pass each (a group holds at most 8 tokens, a pass's worth).
// gate_up's block 0 writes the routing the combine reads. s_tok[p]: sorted pair p's token (the
// row of xs stage_row_fold puts it in); s_inv_rms[t]: token t's RMS scale.
// s_w: each group's softmax weight where down adds its weighted rows itself (RouterFold::moe_out,
// one token). CAP: the launch's fold capacity (kernels.h), f.n <= CAP.
template <int CAP>
__device__ __forceinline__ int scan_units_fold(const SkinnyArgs& a, int tb, int* s_unit0, int* s_expert, int* s_start,
                                               int* s_end, float* scratch, float* s_inv_rms, float* s_w, int* s_tok) {
  const RouterFold& f = a.r.fold;
  if (!a.r.settled) pdl_wait();
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  if (f.n == 1) {
#ifdef GPTOSS_DIAG_UNITS_CLOCKS
    long long rclk[5] = {clock64(), 0, 0, 0, 0};
    long long* keys_clock = &rclk[2];
#else
    long long* keys_clock = nullptr;
#endif
    // The sums' loads go out first: the routing waits on them, the row only on the first weights.
    // (Issued behind the row's copy, they arrived ~600 cycles later: H200, s34r2.)
    router_fold::FoldSums sums;
    if (warp == 0) router_fold::fold_load_sums(f, 0, sums);
    if (f.gate_up) {
      for (int i = threadIdx.x; i < a.W.K / 4; i += blockDim.x) ptx::cp_async16(scratch + 4 * i, f.xg + 4 * i, true);
      ptx::cp_async_commit();
    }
#ifdef GPTOSS_DIAG_UNITS_CLOCKS
    rclk[1] = clock64();
#endif
    if (warp == 0) {
      float inv_rms;
      const router_fold::FoldPick p = router_fold::fold_route_sums(f, sums, f.gate_up || f.moe_out, inv_rms, keys_clock);
#ifdef GPTOSS_DIAG_UNITS_CLOCKS
      asm volatile("" ::"r"(p.e), "f"(p.w), "r"(p.slot) : "memory");
      rclk[3] = clock64();
#endif
      if (lane < f.k) {
        s_w[p.slot] = p.w;
        s_unit0[p.slot] = p.slot * tb;
        s_expert[p.slot] = p.e;
        s_start[p.slot] = p.slot;
        s_end[p.slot] = p.slot + 1;
        s_tok[p.slot] = 0;
        if (f.gate_up && blockIdx.x == 0) router_fold::fold_write_routing(a.r, lane, f.k, p);
      }
      if (lane == 0) {
        s_unit0[f.k] = f.k * tb;
        s_inv_rms[0] = inv_rms;
      }
    }
    __syncthreads();
#ifdef GPTOSS_DIAG_UNITS_CLOCKS
    rclk[4] = clock64();
    if (threadIdx.x == 0) {
      for (int i = 0; i < 4; ++i)
        atomicAdd(&g_fold_route_clocks[f.gate_up ? 0 : 1][i], (unsigned long long)(rclk[i + 1] - rclk[i]));
      atomicAdd(&g_fold_route_clocks[f.gate_up ? 0 : 1][7], 1ull);
    }
#endif
    return f.k * tb;
  }
  // 2-8 tokens. The picks in token order ([t][j], as topk_idx), then the sort.
  __shared__ int s_pick_e[CAP * kMaxTopK];
  __shared__ float s_pick_w[CAP * kMaxTopK];
  __shared__ int s_units;
  __shared__ int s_sort_counts[2], s_sort_slot[32], s_sort_tile_group[32], s_sort_tile_row[32];
  __shared__ float s_sort_pair_w[32];
  const int k = f.k, nv = router_fold::real_tokens(f);
  if (warp < nv) {
    float inv_rms;
    const router_fold::FoldPick p = router_fold::fold_route_warp(f, warp, true, inv_rms);
    if (lane < k) {
      s_pick_e[warp * k + lane] = p.e;
      s_pick_w[warp * k + lane] = p.w;
    }
    if (lane == 0) s_inv_rms[warp] = inv_rms;
  }
  __syncthreads();
  if (warp == 0) {
    const int P = nv * k;
    // The pairs sorted by expert, then pair index, into this block's shared memory by the decode
    // router's own sort (moe_sort_warp, on a MoeRouting whose arrays are shared memory): the groups
    // and the sorted pairs' tokens (s_tok) are then those gate_up's block 0 writes for the combine.
    MoeRouting sr;
    sr.counts = s_sort_counts;
    sr.group_expert = s_expert;
    sr.group_start = s_start;
    sr.group_end = s_end;
    sr.tile_group = s_sort_tile_group;
    sr.tile_row = s_sort_tile_row;
    sr.pair_token = s_tok;
    sr.pair_weight = s_sort_pair_w;
    sr.slot_pair = s_sort_slot;
    moe_sort_warp(P, k, sr, 0, f.E, s_pick_e, s_pick_w);
    __syncwarp();
    const int groups = s_sort_counts[0];
    for (int g = lane; g <= groups; g += 32) s_unit0[g] = g * tb;
    if (lane == 0) s_units = groups * tb;
    if (f.gate_up && blockIdx.x == 0) {
      // The combine's routing, as the fused decode router leaves it (route_sort.cuh).
      if (lane < P) {
        a.r.topk_idx[lane] = s_pick_e[lane];
        a.r.topk_w[lane] = s_pick_w[lane];
      }
      moe_sort_warp(P, k, a.r, 0, f.E, s_pick_e, s_pick_w);
      clear_padding_slots(a.r, P, f.n * k, lane, 32);
    }
  }
  __syncthreads();
  return s_units;
}

// down after a folded router with the combine folded too (RouterFold::moe_out): finish_tiles, but
// each row's output times its pair's weight w added into moe_out in fixed point (x 2^32; one
// token: column 0 of the tile, lanes tq == 0) instead of stored.
template <int KS, int RT>
__device__ __forceinline__ void finish_tiles_moe_out(const SkinnyArgs& a, float* red, const float (&acc)[RT][1][4],
                                                     int tile0, int expert, float w) {
  constexpr int FMT = WeightMat::kFragMXFP4;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  float fin[1][4];
  if (!sum_tile_slices<1, KS, RT>(red, acc, RT, fin) || tq != 0) return;
  const TileRows tr = tile_rows<FMT>(a, expert, tile0 + warp, g);
  router_fold::add_fixed(a.r.fold.moe_out + tr.lr0, w * (fin[0][0] * tr.sc0 + tr.b0), router_fold::kLogitScale);
  router_fold::add_fixed(a.r.fold.moe_out + tr.lr1, w * (fin[0][2] * tr.sc1 + tr.b1), router_fold::kLogitScale);
}

// gate_up after a folded router, every thread: stores each token's row scaled by its RMS scale in
// fp16 (what the router's fused norm would have left in xn) into xs row t. One token: from
// scan_units_fold's copy of xg (waited for here); 2-8 tokens: from xg in L2 (the real tokens'
// rows; the loads go out under the first weight loads).
__device__ __forceinline__ void stage_row_fold(const SkinnyArgs& a, const float* scratch, const float* s_inv_rms,
                                               uint16_t* xs, int xs_ld) {
  const RouterFold& f = a.r.fold;
  auto store = [&](uint16_t* dst, float4 v, float inv_rms) {
    store_staged4<true>(dst, v.x * inv_rms, v.y * inv_rms, v.z * inv_rms, v.w * inv_rms);
  };
  const int n4 = a.W.K / 4;
  if (f.n == 1) {
    ptx::cp_async_wait<0>();
    __syncthreads();
    const float inv_rms = s_inv_rms[0];
    for (int i = threadIdx.x; i < n4; i += blockDim.x) store(xs + 4 * i, reinterpret_cast<const float4*>(scratch)[i], inv_rms);
  } else {
    const int nv = router_fold::real_tokens(f);
    for (int i = threadIdx.x; i < nv * n4; i += blockDim.x) {
      const int t = i / n4, c = i - t * n4;
      const float4 v = __ldcg(reinterpret_cast<const float4*>(f.xg + size_t(t) * f.H) + c);
      store(xs + size_t(t) * xs_ld + 4 * c, v, s_inv_rms[t]);
    }
  }
  __syncthreads();
}

// A unit of skinny_units_kernel (and of the pair kernel below): its first row tile, expert, and
// the pass's sorted pairs [tok0, tok_end).
struct Unit {
  int tile0, expert, tok0, tok_end;
};
using MxChunk = WChunk<WeightMat::kFragMXFP4>;

// A lane's weight and scale pointers at its first chunk of unit x (T row tiles an expert, CC
// chunks a row tile; its warp's K slice starts at chunk `warp`), and the unit's first PF chunk
// steps into wbuf.
// L = WLoad::kStaged: the unit's chunks and scale words wait in shared memory in their global
// order, from `staged_w` / `staged_s` on (the pair kernel's staged down unit).
template <int KS, int RT, int PF, int CC, WLoad L = kExpertWeightLoad>
__device__ __forceinline__ void unit_load_first(const SkinnyArgs& a, int T, const Unit& x, int my_n,
                                                MxChunk (&wbuf)[PF][RT], const uint4*& wl, const uint32_t*& sl,
                                                const uint4* staged_w = nullptr, const uint32_t* staged_s = nullptr) {
  constexpr int FMT = WeightMat::kFragMXFP4;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2;
  if constexpr (L == WLoad::kStaged) {
    wl = staged_w + size_t(warp) * (chunk_bytes<FMT>() / 16) + lane;
    sl = staged_s + size_t(warp) * 8 + g;
  } else {
    const size_t tc0 = (size_t(x.expert) * T + x.tile0) * CC + warp;
    wl = static_cast<const uint4*>(a.W.w) + tc0 * (chunk_bytes<FMT>() / 16) + lane;
    sl = reinterpret_cast<const uint32_t*>(a.W.scales) + tc0 * 8 + g;
  }
#pragma unroll
  for (int u = 0; u < PF; ++u)
    if (u < my_n)
#pragma unroll
      for (int r = 0; r < RT; ++r) load_w_at<FMT, L>(wl, sl, r * CC + u * KS, wbuf[u][r]);
}

// A unit's chunk steps over the warp's K slice (my_n chunks, KS apart): each step's MMAs on its
// staged activations (xs_lane: the lane's row of xs, zeros where !row), then that step's ring slot
// refilled PF steps ahead. acc accumulates (the caller zeroes it).
template <int KS, int RT, int PF, int CC, WLoad L = kExpertWeightLoad>
__device__ __forceinline__ void unit_chunks(MxChunk (&wbuf)[PF][RT], const uint4*& wl, const uint32_t*& sl,
                                            const uint16_t* xs_lane, bool row, int my_n, float (&acc)[RT][1][4]) {
  constexpr int FMT = WeightMat::kFragMXFP4;
  const int warp = threadIdx.x / 32;
  for (int base = 0; base < my_n; base += PF) {
#pragma unroll
    for (int v = 0; v < PF; ++v) {
      if (base + v < my_n) {
        uint4 x[1][2];
        if (row) {
          const uint4* p = reinterpret_cast<const uint4*>(xs_lane + (warp + (base + v) * KS) * 64);
          x[0][0] = p[0];
          x[0][1] = p[4];
        } else {
          x[0][0] = x[0][1] = make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int r = 0; r < RT; ++r) chunk_mma<FMT, 1, true>(wbuf[v][r], x, acc[r]);
        if (base + v + PF < my_n) {
          // As in skinny_mma_kernel: the loads after this chunk's MMAs, which free their registers.
          if constexpr (RT >= 4) asm volatile("" ::: "memory");
#pragma unroll
          for (int r = 0; r < RT; ++r) load_w_at<FMT, L>(wl, sl, r * CC + (v + PF) * KS, wbuf[v][r]);
        }
      }
    }
    wl += PF * KS * (chunk_bytes<FMT>() / 16);
    sl += PF * KS * 8;
  }
}

// Grouped one-n-tile MXFP4 launches (1-64 tokens touch 4-111 experts: 360-10,000 (group, row-tile
// block) pairs at 120b's gate_up with four row tiles a block). The work is cut into units of one pass (<= 8
// of a group's tokens) over one block of RT row tiles, in (group, pass, row-tile block) order,
// and a grid of as many blocks as the GPU holds at once takes a contiguous, equal run each (a
// group of 17 tokens is three passes, so three times the units: blocks stay balanced whatever
// the groups' sizes). Against one block a (group, row-tile block), as skinny_mma_kernel runs it:
//  - the routing is read once a block, all groups at once, not once a (group, row-tile block);
//  - the next unit's first weight loads go out before the current unit's reduction and stores,
//    so a block never starts a unit on an empty pipe;
//  - a pass's activation rows are staged once for all the block's units of that pass.
// Each row's sums run in the same order as in skinny_mma_kernel with the same KS (chunks per
// warp, warps added in order): the two agree bit for bit. K = 64 CC, T % RT == 0, at most
// KS * 32 - 1 groups (a thread each in the scan).
// FOLD_CAP: after a folded router (MoeRouting::fold, 1-8 tokens, K = 2880; 0 elsewhere): routes from
// the fold's sums (scan_units_fold); gate_up stages its rows from the fold's xg. Its shared arrays
// hold FOLD_CAP tokens (4 or 8: kernels.h).
// The dynamic shared memory starts 128-byte aligned (so too in skinny_warp_units_kernel and
// skinny_mma_kernel). At 16 it starts where the static arrays end, and this kernel's one-token
// step time followed that offset mod 128 (H200, thirty-first session, s31r2-r3, 120b fp8 tg64 x1
// with the fold's arrays sized for 1, 2, 3, 4 and 8 tokens: static 4176 / 4336 / 4448 / 4544 /
// 4944 bytes, offset mod 128 80 / 112 / 96 / 64 / 80: 529 / 540 / 550 / 550 / 533 tok/s, the
// means of four runs; aligned to 128: 549-555 at every size; 20b 775-804 -> 804-812): the
// unexplained 3% of the thirtieth session's regression was this. (Offsets of 16 mod 32 were the
// slow ones; why is not established.)
template <int KS, int RT, int PF, bool XF16, int CC, int FOLD_CAP = 0>
__global__ void __launch_bounds__(KS * 32, skinny_min_blocks(1, KS, RT, PF)) skinny_units_kernel(SkinnyArgs a) {
  constexpr bool FOLD = FOLD_CAP > 0;
  constexpr int FMT = WeightMat::kFragMXFP4, C = CC, kMaxGroups = KS * 32;
  static_assert(PF >= 1 && RT <= KS && CC > 0, "prefetch depth; one finishing warp per row tile; fixed K");
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2;
  const int T = a.W.N / 16, TB = T / RT;  // row-tile blocks an expert
#ifdef GPTOSS_DIAG_UNITS_CLOCKS
  long long uclk[6] = {0, 0, 0, 0, 0, 0};
#endif
  UNITS_CLOCK(0);
#ifdef GPTOSS_DIAG_UNITS_CLOCKS
  if (!a.r.settled) pdl_wait();  // (the scans' own wait then returns at once)
#endif
  UNITS_CLOCK(1);
  extern __shared__ __align__(128) float red[];
  uint16_t* xs = reinterpret_cast<uint16_t*>(red + KS * RT * 4 * 32);
  const int xs_ld = C * 64 + 8;
  const int my_n = C > warp ? (C - 1 - warp) / KS + 1 : 0;
  // Per group: its first unit (then the total at [ngroups]), expert and sorted rows.
  __shared__ int s_unit0[kMaxGroups], s_expert[kMaxGroups], s_start[kMaxGroups], s_end[kMaxGroups];
  __shared__ int s_warp_passes[KS];

  // (After a folded router, gate_up's row is staged by the scan through red, which holds K floats
  // at four row tiles: launch_skinny_units runs gate_up's fold in that shape only.)
  __shared__ float s_inv_rms[FOLD ? FOLD_CAP : 1], s_w[kMaxTopK];
  __shared__ int s_tok[FOLD ? FOLD_CAP * kMaxTopK : 1];
  // The tokens' rows staged once, row t token t, by the fold's scan and stage_row_fold, for every
  // unit (a unit's B row g is its sorted pair's token's: s_tok).
  const bool row_staged = FOLD && a.r.fold.gate_up;
  const int units = FOLD ? scan_units_fold<FOLD ? FOLD_CAP : 1>(a, TB, s_unit0, s_expert, s_start, s_end, red, s_inv_rms,
                                                                s_w, s_tok)
                         : scan_units<KS>(a, TB, s_unit0, s_expert, s_start, s_end, s_warp_passes);
  UNITS_CLOCK(2);
  const int u0 = int(int64_t(blockIdx.x) * units / gridDim.x);
  const int u1 = int(int64_t(blockIdx.x + 1) * units / gridDim.x);
  if (u0 >= u1) {  // uniform over the block
    if (row_staged) ptx::cp_async_wait<0>();
    pdl_trigger();
    return;
  }

  int cursor = 0;  // the group of the last unit decoded (units only grow within a block)
  auto unit_at = [&](int u) {
    while (s_unit0[cursor + 1] <= u) ++cursor;
    Unit x;
    const int rel = u - s_unit0[cursor], pass = rel / TB;
    x.tile0 = (rel - pass * TB) * RT;
    x.expert = s_expert[cursor];
    x.tok0 = s_start[cursor] + 8 * pass;
    x.tok_end = min(x.tok0 + 8, s_end[cursor]);
    return x;
  };
  MxChunk wbuf[PF][RT];
  const uint4* wl = nullptr;
  const uint32_t* sl = nullptr;
  auto load_first = [&](const Unit& x) { unit_load_first<KS, RT, PF, CC>(a, T, x, my_n, wbuf, wl, sl); };
  Unit cur = unit_at(u0);
  load_first(cur);
  if (a.r.settled) pdl_wait();
  pdl_trigger();
  if (row_staged) stage_row_fold(a, red, s_inv_rms, xs, xs_ld);  // under the first weight loads
  UNITS_CLOCK(3);

  int staged_tok0 = -1;  // the pass whose rows xs holds (its first sorted pair)
  for (int u = u0; u < u1; ++u) {
    if (warp < RT) prefetch_tile_rows<FMT>(a, cur.expert, cur.tile0 + warp, g);
    const int ntok = cur.tok_end - cur.tok0;
    if (cur.tok0 != staged_tok0 && !row_staged) {
      __syncthreads();  // every warp is done reading xs
      stage_rows<!XF16>(a, cur.tok0, ntok, xs, xs_ld);
      __syncthreads();
      staged_tok0 = cur.tok0;
    }
    int xs_row = g;
    if constexpr (FOLD)
      if (row_staged) xs_row = g < ntok ? s_tok[cur.tok0 + g] : 0;
    const uint16_t* xs_lane = xs + size_t(xs_row) * xs_ld + 8 * (lane & 3);
    float acc[RT][1][4];
#pragma unroll
    for (int r = 0; r < RT; ++r) acc[r][0][0] = acc[r][0][1] = acc[r][0][2] = acc[r][0][3] = 0.f;
    unit_chunks<KS, RT, PF, CC>(wbuf, wl, sl, xs_lane, g < ntok, my_n, acc);
#ifdef GPTOSS_DIAG_UNITS_CLOCKS
    if (u == u0) UNITS_CLOCK(4);
#endif
    const Unit done = cur;
    if (u + 1 < u1) {
      // The next unit's first weights go out now; this unit's reduction and stores run under them.
      cur = unit_at(u + 1);
      load_first(cur);
    }
    if constexpr (FOLD) {
      if (a.r.fold.moe_out && !a.r.fold.gate_up)  // one pair a group: its slot is its first sorted row
        finish_tiles_moe_out<KS, RT>(a, red, acc, done.tile0, done.expert, s_w[done.tok0]);
      else
        finish_tiles<FMT, 1, KS, RT>(a, red, acc, RT, done.tile0, done.expert, done.tok0, done.tok_end);
    } else {
      finish_tiles<FMT, 1, KS, RT>(a, red, acc, RT, done.tile0, done.expert, done.tok0, done.tok_end);
    }
  }
#ifdef GPTOSS_DIAG_UNITS_CLOCKS
  UNITS_CLOCK(5);
  if (threadIdx.x == 0) {
    const int kind = FOLD ? (a.r.fold.gate_up ? 0 : 1) : 2;
    for (int i = 0; i < 5; ++i) atomicAdd(&g_units_clocks[kind][i], (unsigned long long)(uclk[i + 1] - uclk[i]));
    atomicAdd(&g_units_clocks[kind][7], 1ull);
  }
#endif
}

// One token after a folded router (RouterFold, n == 1): gate_up and down in one launch. Block b
// takes gate_up's unit b, then down's unit b: both cut an expert into the same number of units
// (gate_up's 360 row tiles in fours, down's 180 in twos, four row tiles a warp's K slice would
// not fit beside gate_up's), so block b's down unit is of the expert its gate_up unit was. An
// expert's down units need only that expert's gate_up rows: each block counts its finished
// gate_up unit into sync[slot] (release), and its down unit waits on sync[slot] (acquire) with
// the routing already known (gate_up's) and its first weights already asked for. Two launches
// cost down the whole of gate_up's end (its last block, the grid's flush), its own blocks'
// start (gate_up's grid fills the GPU), routing again from the fold's sums and only then its
// first weight loads: ~3,300 cycles to route and ~3,200 more to its loop in the thirty-third
// session's clocks (H200, 120b fp8), ~3.3 us of the 9.6 down added to the step.
// Every block must be resident at once (a waiting block holds its SM slot until the blocks it
// waits for have run): the launcher takes the grid only where it fits the GPU in one wave. The
// last of a slot's down blocks to pass its wait resets both of the slot's counters
// (sync[kMaxTopK + slot] counts the passes) for the next launch. Each row's sums are the two
// kernels' (the same unit helpers and shapes): the outputs equal theirs bit for bit.
// Measured slower (H100, forty-sixth session, s46r2-r3, traced 120b fp8 one-token step): 28.35 us
// a layer against 18.48 + 9.01 for the two launches, tg128 -1 to -3%, whether the waits polled
// with acquire loads or relaxed ones; so the backend runs it only where GPTOSS_EXPERT_PAIR=1.
// SD (GPTOSS_EXPERT_PAIR=2): down's whole unit (its two row tiles' 45 chunks, 46 KB, and their
// scale words, 2.8 KB: contiguous in the fragment layout) comes into shared memory by one bulk copy
// as soon as the routing is known, beside gate_up's stream, so that down's bytes are read while
// gate_up's are and only its math waits for the count (three blocks an SM: 3 x ~75 KB).
// A wait that outlasts kPairWaitUs traps (a launch error, not a hang) where the grid did not all
// come resident after all.
constexpr int kPairKs = 8, kPairRtGateUp = 4, kPairRtDown = 2, kPairPfDown = 2, kPairCc = 45;
constexpr uint32_t kPairWaitUs = 200000;
constexpr size_t kPairStagedW = size_t(kPairRtDown) * kPairCc * 512, kPairStagedS = size_t(kPairRtDown) * kPairCc * 32;
// The dynamic shared memory: the K slices' sums (and gate_up's row copy), the staged row, and with SD
// down's unit and an mbarrier.
constexpr size_t pair_smem_bytes(int K, bool sd) {
  return size_t(kPairKs) * kPairRtGateUp * 4 * 32 * sizeof(float) + ((size_t(K + 8) * 2 + 15) / 16) * 16 +
         (sd ? kPairStagedW + kPairStagedS + 16 : 0);
}
template <bool XF16, int FOLD_CAP, bool SD>
__global__ void __launch_bounds__(kPairKs * 32, skinny_min_blocks(1, kPairKs, kPairRtGateUp, 1))
    skinny_units_pair_kernel(SkinnyArgs gu, SkinnyArgs dn, int* sync) {
  constexpr int FMT = WeightMat::kFragMXFP4, KS = kPairKs, RTG = kPairRtGateUp, RTD = kPairRtDown, C = kPairCc;
  constexpr int kMaxGroups = KS * 32;
  static_assert(skinny_min_blocks(1, KS, RTD, kPairPfDown) >= skinny_min_blocks(1, KS, RTG, 1), "down's shape fits");
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2;
  extern __shared__ __align__(128) float red[];  // K floats (the row's copy), then the K slices' sums
  uint16_t* xs = reinterpret_cast<uint16_t*>(red + KS * RTG * 4 * 32);
  const int xs_ld = C * 64 + 8;
  const int my_n = C > warp ? (C - 1 - warp) / KS + 1 : 0;
  __shared__ int s_unit0[kMaxGroups], s_expert[kMaxGroups], s_start[kMaxGroups], s_end[kMaxGroups];
  __shared__ float s_inv_rms[FOLD_CAP], s_w[kMaxTopK];
  __shared__ int s_tok[FOLD_CAP * kMaxTopK];

  // gate_up: routes from the fold's sums after its wait, its one row staged from xg.
  const int Tg = gu.W.N / 16, TB = Tg / RTG;
  scan_units_fold<FOLD_CAP>(gu, TB, s_unit0, s_expert, s_start, s_end, red, s_inv_rms, s_w, s_tok);
  const int slot = blockIdx.x / TB;  // (the launcher: gridDim.x = k * TB, one pair a slot)
  const Unit x{int(blockIdx.x - slot * TB) * RTG, s_expert[slot], s_start[slot], s_end[slot]};
  const int Td = dn.W.N / 16;
  const Unit y{int(blockIdx.x - slot * TB) * RTD, x.expert, x.tok0, x.tok_end};
  MxChunk wg[1][RTG];
  const uint4* wl = nullptr;
  const uint32_t* sl = nullptr;
  unit_load_first<KS, RTG, 1, C>(gu, Tg, x, my_n, wg, wl, sl);
  // SD: down's unit after gate_up's first loads, into shared memory past the staged row.
  unsigned char* staged = reinterpret_cast<unsigned char*>(xs) + ((size_t(xs_ld) * 2 + 15) / 16) * 16;
  const uint32_t bar = ptx::smem_u32(staged + kPairStagedW + kPairStagedS);
  if constexpr (SD) {
    if (threadIdx.x == 0) {
      ptx::mbar_init(bar, 1);
      ptx::mbar_init_fence();
      const size_t tc0 = (size_t(y.expert) * Td + y.tile0) * C;
      ptx::mbar_arrive_expect_tx(bar, uint32_t(kPairStagedW + kPairStagedS));
      ptx::bulk_copy_g2s(ptx::smem_u32(staged), static_cast<const unsigned char*>(dn.W.w) + tc0 * 512,
                         uint32_t(kPairStagedW), bar);
      ptx::bulk_copy_g2s(ptx::smem_u32(staged + kPairStagedW), static_cast<const unsigned char*>(dn.W.scales) + tc0 * 32,
                         uint32_t(kPairStagedS), bar);
    }
  }
  pdl_trigger();
  stage_row_fold(gu, red, s_inv_rms, xs, xs_ld);  // under the first weight loads
  if (warp < RTG) prefetch_tile_rows<FMT>(gu, x.expert, x.tile0 + warp, g);
  {
    const uint16_t* xs_lane = xs + size_t(g < 1 ? s_tok[x.tok0 + g] : 0) * xs_ld + 8 * (lane & 3);
    float acc[RTG][1][4] = {};
    unit_chunks<KS, RTG, 1, C>(wg, wl, sl, xs_lane, g < 1, my_n, acc);
    // down's first weights go out now (SD: they are on their way); gate_up's reduction and stores
    // run under them.
    MxChunk wd[kPairPfDown][RTD];
    if constexpr (!SD) unit_load_first<KS, RTD, kPairPfDown, C>(dn, Td, y, my_n, wd, wl, sl);
    finish_tiles<FMT, 1, KS, RTG>(gu, red, acc, RTG, x.tile0, x.expert, x.tok0, x.tok_end);
    // This unit's rows are out: count it for the slot's down units (the block's stores, a
    // barrier, one release).
    __syncthreads();
    if (threadIdx.x == 0) red_add_release_gpu(sync + slot, 1);
    if (warp < RTD) prefetch_tile_rows<FMT>(dn, y.expert, y.tile0 + warp, g);
    if (threadIdx.x == 0) {
      wait_count_acquire_gpu(sync + slot, TB, kPairWaitUs);
      if (atomicAdd(sync + kMaxTopK + slot, 1) == TB - 1) {  // the slot's last down block: reset
        sync[slot] = 0;
        sync[kMaxTopK + slot] = 0;
      }
    }
    __syncthreads();
    // The slot's act row, written by other blocks of this launch: through L2 (cp.async.cg), not L1.
    stage_rows<!XF16, true>(dn, y.tok0, 1, xs, xs_ld);
    __syncthreads();
    float acc2[RTD][1][4] = {};
    const uint16_t* xs_lane2 = xs + size_t(g) * xs_ld + 8 * (lane & 3);
    if constexpr (SD) {
      ptx::mbar_wait_bounded(bar, 0, kPairWaitUs);
      unit_load_first<KS, RTD, kPairPfDown, C, WLoad::kStaged>(dn, Td, y, my_n, wd, wl, sl,
                                                               reinterpret_cast<const uint4*>(staged),
                                                               reinterpret_cast<const uint32_t*>(staged + kPairStagedW));
      unit_chunks<KS, RTD, kPairPfDown, C, WLoad::kStaged>(wd, wl, sl, xs_lane2, g < 1, my_n, acc2);
    } else {
      unit_chunks<KS, RTD, kPairPfDown, C>(wd, wl, sl, xs_lane2, g < 1, my_n, acc2);
    }
    if (dn.r.fold.moe_out)
      finish_tiles_moe_out<KS, RTD>(dn, red, acc2, y.tile0, y.expert, s_w[y.tok0]);
    else
      finish_tiles<FMT, 1, KS, RTD>(dn, red, acc2, RTD, y.tile0, y.expert, y.tok0, y.tok_end);
  }
}

// The warp-per-tile walk: the same units (one pass of <= 8 of a group's tokens over a block of
// row tiles, (group, pass, block) order, an equal contiguous run a block of a GPU-sized grid), but
// each warp takes RTW whole row tiles over all of K instead of a K slice of every tile. So a unit
// ends with no reduction across warps and no barrier: a warp stores its own rows and runs on
// into the next unit, whose first weights its ring already holds; the block meets only where the
// walk crosses into a new pass and its rows are staged. A warp's chunks go through a ring of PF
// chunk steps in registers, refilled as each step's MMAs free it (the last turn of a unit loads
// the next unit's first chunks), so its load stream runs unbroken over the whole walk.
// Each row's sum runs over K in chunk order in one warp: the block-per-tile kernel with KS = 1
// (bench-kernels variant "ks1 rt1 pf4") gives the same bits. A unit block of NW * RTW row tiles
// (the last of an expert may be partial: its idle warps still meet at the barriers); at most
// NW * 32 - 1 groups (a thread each in the scan).
// NTM = 2: a pass is 16 of a group's tokens (a.xs_rows 16), and a unit holding more than 8 runs
// both n-tiles on each decoded chunk (a group of 9-16 tokens walks its weights once, not twice);
// one of 8 or fewer runs the one-n-tile path. Each n-tile's sums are the one-n-tile path's.
// FOLD_CAP (NTM = 1, 2-8 tokens: 4 or 8): after a folded router, as skinny_units_kernel's.
template <int NW, int RTW, int PF, int MINB, bool XF16, int CC, int NTM = 1, int FOLD_CAP = 0>
__global__ void __launch_bounds__(NW * 32, MINB) skinny_warp_units_kernel(SkinnyArgs a) {
  constexpr bool FOLD = FOLD_CAP > 0;
  static_assert(!FOLD || NTM == 1, "the fold's groups hold at most 8 tokens");
  constexpr int FMT = WeightMat::kFragMXFP4, C = CC, kMaxGroups = NW * 32, UT = NW * RTW, PT = 8 * NTM;
  constexpr int CP = (C + PF - 1) / PF * PF;  // a unit's chunk steps, padded to whole turns of the ring
  static_assert(PF >= 1 && CC > 0, "ring depth; fixed K");
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int T = a.W.N / 16, TB = (T + UT - 1) / UT;  // unit blocks an expert
  extern __shared__ __align__(128) uint16_t xs[];
  const int xs_ld = C * 64 + 8;
  __shared__ int s_unit0[kMaxGroups], s_expert[kMaxGroups], s_start[kMaxGroups], s_end[kMaxGroups];
  __shared__ int s_warp_passes[NW];
  __shared__ float s_inv_rms[FOLD ? FOLD_CAP : 1], s_w[kMaxTopK];
  __shared__ int s_tok[FOLD ? FOLD_CAP * kMaxTopK : 1];
  // (The fold's one-token scratch is never asked for: the walk takes the fold at 2-8 tokens.)
  const bool row_staged = FOLD && a.r.fold.gate_up;
  const int units = FOLD ? scan_units_fold<FOLD ? FOLD_CAP : 1>(a, TB, s_unit0, s_expert, s_start, s_end, nullptr,
                                                                s_inv_rms, s_w, s_tok)
                         : scan_units<NW, PT>(a, TB, s_unit0, s_expert, s_start, s_end, s_warp_passes);
  const int u0 = int(int64_t(blockIdx.x) * units / gridDim.x);
  const int u1 = int(int64_t(blockIdx.x + 1) * units / gridDim.x);
  if (u0 >= u1) { pdl_trigger(); return; }  // uniform over the block

  struct Unit {
    int tile, expert, tok0, tok_end;  // tile: this warp's first row tile (>= T: none in this unit)
  };
  int cursor = 0;
  auto unit_at = [&](int u) {
    while (s_unit0[cursor + 1] <= u) ++cursor;
    Unit x;
    const int rel = u - s_unit0[cursor], pass = rel / TB;
    x.tile = (rel - pass * TB) * UT + warp * RTW;
    x.expert = s_expert[cursor];
    x.tok0 = s_start[cursor] + PT * pass;
    x.tok_end = min(x.tok0 + PT, s_end[cursor]);
    return x;
  };
  // This lane's weight and scale pointers at chunk 0 of a unit's first row tile (row tile r at
  // + r * C chunks); null where the warp has no tile in the unit.
  auto lane_ptrs = [&](const Unit& x, const uint4*& wl, const uint32_t*& sl) {
    if (x.tile >= T) { wl = nullptr; sl = nullptr; return; }
    const size_t tc0 = (size_t(x.expert) * T + x.tile) * C;
    wl = static_cast<const uint4*>(a.W.w) + tc0 * (chunk_bytes<FMT>() / 16) + lane;
    sl = reinterpret_cast<const uint32_t*>(a.W.scales) + tc0 * 8 + g;
  };
  WChunk<FMT> wbuf[PF][RTW];
  // A unit's first PF chunk steps into the ring (at a walk's start, and after a unit without a tile).
  auto load_first = [&](const uint4* w, const uint32_t* sc) {
#pragma unroll
    for (int v = 0; v < PF; ++v)
      if (v < C)
#pragma unroll
        for (int r = 0; r < RTW; ++r) load_w_at<FMT, kExpertWeightLoad>(w, sc, r * CC + v, wbuf[v][r]);
  };
  Unit cur = unit_at(u0);
  const uint4* wl;
  const uint32_t* sl;
  lane_ptrs(cur, wl, sl);
  if (wl) load_first(wl, sl);
  if (a.r.settled) pdl_wait();
  pdl_trigger();
  if (row_staged) stage_row_fold(a, nullptr, s_inv_rms, xs, xs_ld);  // under the first weight loads

  int staged_tok0 = -1;
  for (int u = u0; u < u1; ++u) {
    if (wl)
#pragma unroll
      for (int r = 0; r < RTW; ++r) prefetch_tile_rows<FMT>(a, cur.expert, cur.tile + r, g);
    const int ntok = cur.tok_end - cur.tok0;
    if (cur.tok0 != staged_tok0 && !row_staged) {  // uniform over the block
      __syncthreads();
      stage_rows<!XF16>(a, cur.tok0, ntok, xs, xs_ld);
      __syncthreads();
      staged_tok0 = cur.tok0;
    }
    Unit nxt = cur;
    const uint4* nwl = nullptr;
    const uint32_t* nsl = nullptr;
    // The next unit's pointers, asked for only in the last turn of the ring (fewer live registers).
    auto next_unit = [&]() {
      if (u + 1 < u1) {
        nxt = unit_at(u + 1);
        lane_ptrs(nxt, nwl, nsl);
      }
    };
    // One unit of NT n-tiles (NT * 8 >= ntok): the ring over K, then this warp's rows stored.
    auto run_unit = [&](auto nt) {
      constexpr int NT = decltype(nt)::value;
      int xs_row = g;  // (after a folded router: the row of the sorted pair's token, NT = 1)
      if constexpr (FOLD)
        if (row_staged) xs_row = g < ntok ? s_tok[cur.tok0 + g] : 0;
      const uint16_t* xs_lane = xs + size_t(xs_row) * xs_ld + 8 * tq;
      auto chunk = [&](int c, const WChunk<FMT> (&wc)[RTW], float (&acc)[RTW][NT][4]) {
        uint4 x[NT][2];
#pragma unroll
        for (int i = 0; i < NT; ++i) {
          if (g + 8 * i < ntok) {
            const uint4* p = reinterpret_cast<const uint4*>(xs_lane + size_t(8 * i) * xs_ld + c * 64);
            x[i][0] = p[0];
            x[i][1] = p[4];
          } else {
            x[i][0] = x[i][1] = make_uint4(0, 0, 0, 0);
          }
        }
#pragma unroll
        for (int r = 0; r < RTW; ++r) chunk_mma<FMT, NT, true>(wc[r], x, acc[r]);
      };
      float acc[RTW][NT][4];
#pragma unroll
      for (int r = 0; r < RTW; ++r)
#pragma unroll
        for (int i = 0; i < NT; ++i) acc[r][i][0] = acc[r][i][1] = acc[r][i][2] = acc[r][i][3] = 0.f;
      const uint4* w = wl;
      const uint32_t* sc = sl;
      // Every turn but the last: chunk base + v, then its slot takes chunk base + v + PF.
#pragma unroll 1
      for (int base = 0; base < CP - PF; base += PF) {
#pragma unroll
        for (int v = 0; v < PF; ++v) {
          chunk(base + v, wbuf[v], acc);
          if (base + v + PF < C)
#pragma unroll
            for (int r = 0; r < RTW; ++r) load_w_at<FMT, kExpertWeightLoad>(w, sc, r * CC + v + PF, wbuf[v][r]);
        }
        w += PF * (chunk_bytes<FMT>() / 16);
        sc += PF * 8;
      }
      // The last turn: each slot, once used, takes the next unit's chunk v.
      next_unit();
#pragma unroll
      for (int v = 0; v < PF; ++v) {
        if (CP - PF + v < C) chunk(CP - PF + v, wbuf[v], acc);
        if (nwl && v < C)
#pragma unroll
          for (int r = 0; r < RTW; ++r) load_w_at<FMT, kExpertWeightLoad>(nwl, nsl, r * CC + v, wbuf[v][r]);
      }
#pragma unroll
      for (int r = 0; r < RTW; ++r) {
        const TileRows tr = tile_rows<FMT>(a, cur.expert, cur.tile + r, g);
#pragma unroll
        for (int i = 0; i < NT; ++i) {
          float fin[4];
#pragma unroll
          for (int v = 0; v < 4; ++v) fin[v] = 0.f + acc[r][i][v];  // as finish_tiles' sum over one warp
          tile_store(a, tr, cur.tile + r, g, tq, cur.tok0 + 8 * i, cur.tok_end, fin);
        }
      }
    };
    if (wl) {
      if (NTM == 2 && ntok > 8)
        run_unit(std::integral_constant<int, NTM>{});
      else
        run_unit(std::integral_constant<int, 1>{});
    } else {
      // No tile in this unit (the partial block at an expert's end): the next unit's first chunks.
      next_unit();
      if (nwl) load_first(nwl, nsl);
    }
    cur = nxt;
    wl = nwl;
    sl = nsl;
  }
}

// K of the unit kernels' compiled chunk counts: gpt-oss's 2880 and 4096, and down's intermediate
// slices at TP=2 (1472 + 1408).
bool units_take_k(int K) {
  return K == 2880 || K == 4096 || (skinny_tp_cc_enabled() && (K == 1472 || K == 1408));
}

// Launches a unit-walking kernel over a grid of every block the GPU holds at once (or one a unit
// where fewer), if its `units` fill at least `min_fill` of those blocks; returns whether it did.
// The blocks an SM holds at this shared-memory size are asked once a kernel and size (cached per
// thread: TP ranks may share a process).
bool launch_walk(void (*k)(SkinnyArgs), int threads, size_t smem, size_t units, double min_fill, const SkinnyArgs& a,
                 cudaStream_t s) {
  thread_local std::unordered_map<const void*, std::pair<size_t, int>> blocks_an_sm;
  auto& c = blocks_an_sm[reinterpret_cast<const void*>(k)];
  if (c.first != smem) {
    allow_dynamic_smem(k, smem);
    int b = 0;
    GPTOSS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, k, threads, smem));
    c = {smem, std::max(b, 1)};
  }
  const size_t resident = size_t(sm_count()) * c.second;
  if (double(units) < min_fill * double(resident)) return false;
  launch_pdl(k, dim3(unsigned(std::min(resident, units))), dim3(threads), smem, s, a);
  return true;
}

// The unit-walking grouped kernel (skinny_units_kernel) for this launch, if it takes it (units_take_k,
// whole row-tile blocks, fewer groups than threads) and its units (at least one a (group, row-tile
// block)) fill at least `min_fill` of the blocks the GPU holds at once.
template <int KS, int RT, int PF, bool XF16, int FOLD_CAP = 0>
bool launch_units(const SkinnyArgs& a, int tiles, int groups, double min_fill, cudaStream_t s) {
  const int K = a.W.K;
  if (!a.grouped || !skinny_cc_enabled() || tiles % RT != 0 || !units_take_k(K) || groups >= KS * 32) return false;
  const size_t smem = size_t(KS) * RT * 4 * 32 * sizeof(float) + size_t(a.xs_rows) * (K + 8) * 2;
  const size_t units = size_t(tiles / RT) * groups;
  if constexpr (FOLD_CAP > 0) {  // gpt-oss's experts (K = 2880) only
    if (K != 2880) return false;
    return launch_walk(skinny_units_kernel<KS, RT, PF, XF16, 45, FOLD_CAP>, KS * 32, smem, units, min_fill, a, s);
  }
  auto k = K == 2880 ? skinny_units_kernel<KS, RT, PF, XF16, 45>
           : K == 4096 ? skinny_units_kernel<KS, RT, PF, XF16, 64>
           : K == 1472 ? skinny_units_kernel<KS, RT, PF, XF16, 23>
                       : skinny_units_kernel<KS, RT, PF, XF16, 22>;  // 1408
  return launch_walk(k, KS * 32, smem, units, min_fill, a, s);
}

// The warp-per-tile kernel (skinny_warp_units_kernel) for this launch, if it takes it (units_take_k,
// T % RTW == 0, fewer groups than threads) and its units fill at least `min_fill` of the blocks
// the GPU holds at once.
template <int NW, int RTW, int PF, int MINB, bool XF16, int NTM = 1, int FOLD_CAP = 0>
bool launch_warp_units(const SkinnyArgs& a_in, int tiles, int groups, double min_fill, cudaStream_t s) {
  SkinnyArgs a = a_in;
  a.xs_rows = std::min(a.M, 8 * NTM);  // a pass's rows (a group has <= M)
  const int K = a.W.K;
  if (!a.grouped || !skinny_cc_enabled() || tiles % RTW != 0 || !units_take_k(K) || groups >= NW * 32) return false;
  const size_t smem = size_t(a.xs_rows) * (K + 8) * 2;
  const size_t units = size_t((tiles + NW * RTW - 1) / (NW * RTW)) * groups;
  if constexpr (FOLD_CAP > 0) {  // gpt-oss's experts (K = 2880) only
    if (K != 2880) return false;
    return launch_walk(skinny_warp_units_kernel<NW, RTW, PF, MINB, XF16, 45, 1, FOLD_CAP>, NW * 32, smem, units, min_fill,
                       a, s);
  }
  auto k = K == 2880 ? skinny_warp_units_kernel<NW, RTW, PF, MINB, XF16, 45, NTM>
           : K == 4096 ? skinny_warp_units_kernel<NW, RTW, PF, MINB, XF16, 64, NTM>
           : K == 1472 ? skinny_warp_units_kernel<NW, RTW, PF, MINB, XF16, 23, NTM>
                       : skinny_warp_units_kernel<NW, RTW, PF, MINB, XF16, 22, NTM>;  // 1408
  return launch_walk(k, NW * 32, smem, units, min_fill, a, s);
}

// The warp-per-tile walk takes a launch by default where its units fill the GPU's blocks at least
// GPTOSS_WARP_UNITS times over (default 2; 0 turns it off), with 16-token passes where the
// launch's mean group holds GPTOSS_WARP_UNITS_16 tokens or more (default 7; 0 turns them off).
int warp_units_min_fill() {
  static const int fill = env_int("GPTOSS_WARP_UNITS", 2);
  return fill;
}
int warp_units_16_min_mean() {
  static const int mean = env_int("GPTOSS_WARP_UNITS_16", 7);
  return mean;
}

bool units_rt6_enabled() {
  static const bool on = env_int("GPTOSS_UNITS_RT6", 1) != 0;
  return on;
}

// The pair kernel's launch (launch_experts_pair), or false where it does not take the problem.
template <bool XF16, bool SD>
bool launch_pair(const SkinnyArgs& gu, const SkinnyArgs& dn, int* sync, cudaStream_t s) {
  return with_router_fold_capacity(1, [&](auto cap) {
    constexpr int CAP = decltype(cap)::value;
    auto k = skinny_units_pair_kernel<XF16, CAP, SD>;
    const size_t smem = pair_smem_bytes(gu.W.K, SD);
    thread_local std::unordered_map<int, int> blocks_an_sm;  // by device
    int dev = 0;
    GPTOSS_CUDA_CHECK(cudaGetDevice(&dev));
    auto it = blocks_an_sm.find(dev);
    if (it == blocks_an_sm.end()) {
      allow_dynamic_smem(k, smem);
      // SD's three blocks an SM need nearly all of it as shared memory.
      if (SD) GPTOSS_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
      int b = 0;
      GPTOSS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, k, kPairKs * 32, smem));
      it = blocks_an_sm.emplace(dev, b).first;
    }
    const int units = gu.r.fold.k * (gu.W.N / 16 / kPairRtGateUp);
    if (size_t(units) > size_t(sm_count()) * it->second) return false;  // not one wave: a wait could hold a slot forever
    launch_pdl(k, dim3(unsigned(units)), dim3(kPairKs * 32), smem, s, gu, dn, sync);
    return true;
  });
}

}  // namespace

bool router_fold_experts_take(const WeightMat& W) {
  return W.fmt == WeightMat::kFragMXFP4 && W.K == 2880 && skinny_cc_enabled();
}

namespace skinny {

bool launch_skinny_units(const SkinnyArgs& a, int tiles, int groups, bool xf16, int shape, bool k_split_only,
                         cudaStream_t s) {
#ifdef GPTOSS_DIAG_UNITS_CLOCKS
  static const bool registered = (std::atexit(print_units_clocks), true);
  (void)registered;
#endif
  auto run = [&](auto f16) {
    constexpr bool X = decltype(f16)::value;
    // After a folded router: at 2-8 tokens the warp walk where the default below would take it;
    // else the K-split kernel's one-token shapes, routing from the fold. gate_up's takes four row
    // tiles (at one token its row passes through red: 4,096 floats >= K = 2880).
    if (a.r.fold.acc) {
      if (shape != 0) return false;
      return with_router_fold_capacity(a.r.fold.n, [&](auto cap) {
        constexpr int CAP = decltype(cap)::value;
        if (a.r.fold.n > 1 && !k_split_only && warp_units_min_fill() > 0 &&
            launch_warp_units<8, 1, 8, 2, X, 1, CAP>(a, tiles, groups, warp_units_min_fill(), s))
          return true;
        return launch_units<8, 4, 1, X, CAP>(a, tiles, groups, a.r.fold.gate_up ? 0 : 0.5, s) ||
               (!a.r.fold.gate_up && launch_units<8, 2, 2, X, CAP>(a, tiles, groups, 0, s));
      });
    }
    switch (shape) {
      case 1: return launch_units<8, 4, 1, X>(a, tiles, groups, 0, s);
      case 2: return launch_units<8, 1, 4, X>(a, tiles, groups, 0, s);
      case 3: return launch_units<8, 2, 2, X>(a, tiles, groups, 0, s);
      case 4: return launch_units<8, 2, 4, X>(a, tiles, groups, 0, s);
      // Fewer, longer units (two blocks an SM): a third fewer / half the units of rt4, so less
      // of each unit's fixed part (staging, reduction, epilogue) a block. rt8 needs tiles % 8.
      case 5: return launch_units<8, 6, 1, X>(a, tiles, groups, 0, s);
      case 6: return launch_units<8, 8, 1, X>(a, tiles, groups, 0, s);
      // A whole unit in flight: two row tiles x six chunks, every chunk of a warp's K slice at
      // K = 2880 (45 chunks over 8 warps), so a unit costs one memory round trip instead of one
      // a chunk step, and the next unit's loads go out before this one's reduction (16 warps an
      // SM). Cases 7-9 were slower than the default's shape at every size (H200, twenty-first
      // session: 120b gate_up at 64 tokens 279.0 against 286.0-300.6 us).
      case 7: return launch_units<8, 2, 6, X>(a, tiles, groups, 0, s);
      // The same 12 chunks in flight a warp as case 7 over more row tiles and fewer chunk steps:
      // two / three round trips a unit at K = 2880 with the next step's loads issued as each
      // chunk's MMAs free its registers, and half / a third of case 7's units.
      case 8: return launch_units<8, 4, 3, X>(a, tiles, groups, 0, s);
      case 9: return launch_units<8, 6, 2, X>(a, tiles, groups, 0, s);
      // Warp-per-tile walks (skinny_warp_units_kernel): 8 warps a block, RTW row tiles a warp
      // over all of K, a ring of PF chunk steps, MINB blocks an SM.
      case 10: return launch_warp_units<8, 1, 4, 3, X>(a, tiles, groups, 0, s);
      case 11: return launch_warp_units<8, 1, 8, 2, X>(a, tiles, groups, 0, s);
      case 12: return launch_warp_units<8, 2, 4, 2, X>(a, tiles, groups, 0, s);
      case 13: return launch_warp_units<8, 1, 4, 4, X>(a, tiles, groups, 0, s);
      // The default warp walk with passes of 16 tokens (two n-tiles on a unit of 9-16).
      case 14: return launch_warp_units<8, 1, 8, 2, X, 2>(a, tiles, groups, 0, s);
      case 15: return launch_warp_units<8, 1, 6, 2, X, 2>(a, tiles, groups, 0, s);
      // The default. First the warp-per-tile walk, 8 warps a block, one row tile a warp, eight
      // chunk steps in flight, two blocks an SM, where its units fill the GPU's blocks twice over
      // (3 tokens and up at gate_up's shapes, 6 at down's; H200, twenty-first session,
      // bench-kernels 120b gate_up / down at 32 tokens 204.9 -> 185.2 / 106.4 -> 96.5 us, step
      // x32 +4.4-6.2% at 120b, +4.5-6.5% at 20b; at one token its gate_up was slower, 15.8 ->
      // 17.2 us). Not where the caller asks for the K-split order (the batch-invariant mode: one
      // order of sums at every size).
      // Its passes are 16 tokens where the mean group holds 7 or more (20b at 56-64 tokens: ~40%
      // of its groups hold 9-16 and took a second 8-token pass, each reading and decoding its
      // weights again), both n-tiles on each decoded chunk where a unit holds more than 8, with a
      // ring of 6 (registers; H200, twenty-first session, forced at every size: 20b step x64
      // 10147 / 10209 -> 11027 / 11049, x56 +1.5%, x48 no change; serving 20b at 64 streams 7153
      // -> 7579 tok/s; 120b x32 / x64, mean group ~1-2, 1-2% slower).
      // Else the K-split kernel: six row tiles a unit at two blocks an SM where the units fill
      // the GPU's blocks four times over or more (a third fewer units than four row tiles, so
      // less of each unit's fixed part; H200, twentieth session, step x32 / x64 +1.0% at 20b,
      // +0.5% / +1.4% at 120b; slower at one token; GPTOSS_UNITS_RT6=0 turns it off); else four
      // row tiles with one chunk in flight where that fills half the GPU's blocks or more, else
      // two with two (down at one token: 180 against 360 units; bench-kernels, H200, eighth
      // session: 10.5 -> 8.6 us against skinny_mma_kernel).
      default: {
        const int mean_group = groups > 0 ? (a.pairs + groups - 1) / groups : 0;
        if (!k_split_only && warp_units_min_fill() > 0) {
          if (warp_units_16_min_mean() > 0 && mean_group >= warp_units_16_min_mean() &&
              launch_warp_units<8, 1, 6, 2, X, 2>(a, tiles, groups, warp_units_min_fill(), s))
            return true;
          if (launch_warp_units<8, 1, 8, 2, X>(a, tiles, groups, warp_units_min_fill(), s)) return true;
        }
        return (units_rt6_enabled() && launch_units<8, 6, 1, X>(a, tiles, groups, 4, s)) ||
               launch_units<8, 4, 1, X>(a, tiles, groups, 0.5, s) || launch_units<8, 2, 2, X>(a, tiles, groups, 0, s);
      }
    }
  };
  return xf16 ? run(std::true_type{}) : run(std::false_type{});
}

bool launch_experts_pair(const SkinnyArgs& gu, const SkinnyArgs& dn, bool xf16, bool stage_down, int* sync,
                         cudaStream_t s) {
  const RouterFold& f = gu.r.fold;
  if (!sync || !f.acc || !f.gate_up || f.n != 1 || dn.r.fold.gate_up || f.k > kMaxTopK)
    return false;
  if (!gu.grouped || !dn.grouped || dn.gather_a || !skinny_cc_enabled() || gu.W.K != 2880 || dn.W.K != 2880)
    return false;
  // The same units an expert: gate_up's row tiles in fours, down's in twos.
  if (gu.W.N % (16 * kPairRtGateUp) != 0 || dn.W.N % (16 * kPairRtDown) != 0 ||
      gu.W.N / (16 * kPairRtGateUp) != dn.W.N / (16 * kPairRtDown))
    return false;
  if (stage_down) {
    // The bulk-copy engine (sm_90+); the staged unit's 16-byte alignment holds in the fragment layout.
    int dev = 0, major = 0;
    GPTOSS_CUDA_CHECK(cudaGetDevice(&dev));
    GPTOSS_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (major < 9 || reinterpret_cast<uintptr_t>(dn.W.w) % 16 != 0 || reinterpret_cast<uintptr_t>(dn.W.scales) % 16 != 0)
      return false;
    return xf16 ? launch_pair<true, true>(gu, dn, sync, s) : launch_pair<false, true>(gu, dn, sync, s);
  }
  return xf16 ? launch_pair<true, false>(gu, dn, sync, s) : launch_pair<false, false>(gu, dn, sync, s);
}

}  // namespace skinny

}  // namespace gptoss::cuda
