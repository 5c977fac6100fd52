#pragma once
// The device steps of the unit-walking MXFP4 expert kernels (skinny_units.cu's two walks): the
// routing scans (from the router's arrays, or from the router fold's sums), a unit's first loads
// and chunk loop, the fold's row staging and the folded combine's epilogue. Included by
// skinny_units.cu only (an anonymous namespace, and the diagnostic clocks' globals, are its own).
#include <cstdint>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/diag_clocks.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/linear/frag_layout.cuh"
#include "backend/cuda/kernels/linear/skinny_chunk.cuh"
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

// A unit of skinny_units_kernel: its first row tile, expert, and the pass's sorted pairs
// [tok0, tok_end).
struct Unit {
  int tile0, expert, tok0, tok_end;
};
using MxChunk = WChunk<WeightMat::kFragMXFP4>;

// A lane's weight and scale pointers at its first chunk of unit x (T row tiles an expert, CC
// chunks a row tile; its warp's K slice starts at chunk `warp`), and the unit's first PF chunk
// steps into wbuf.
template <int KS, int RT, int PF, int CC>
__device__ __forceinline__ void unit_load_first(const SkinnyArgs& a, int T, const Unit& x, int my_n,
                                                MxChunk (&wbuf)[PF][RT], const uint4*& wl, const uint32_t*& sl) {
  constexpr int FMT = WeightMat::kFragMXFP4;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2;
  const size_t tc0 = (size_t(x.expert) * T + x.tile0) * CC + warp;
  wl = static_cast<const uint4*>(a.W.w) + tc0 * (chunk_bytes<FMT>() / 16) + lane;
  sl = reinterpret_cast<const uint32_t*>(a.W.scales) + tc0 * 8 + g;
#pragma unroll
  for (int u = 0; u < PF; ++u)
    if (u < my_n)
#pragma unroll
      for (int r = 0; r < RT; ++r) load_w_at<FMT, kExpertWeightLoad>(wl, sl, r * CC + u * KS, wbuf[u][r]);
}

// A unit's chunk steps over the warp's K slice (my_n chunks, KS apart): each step's MMAs on its
// staged activations (xs_lane: the lane's row of xs, zeros where !row), then that step's ring slot
// refilled PF steps ahead. acc accumulates (the caller zeroes it).
template <int KS, int RT, int PF, int CC>
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
          for (int r = 0; r < RT; ++r) load_w_at<FMT, kExpertWeightLoad>(wl, sl, r * CC + (v + PF) * KS, wbuf[v][r]);
        }
      }
    }
    wl += PF * KS * (chunk_bytes<FMT>() / 16);
    sl += PF * KS * 8;
  }
}

}  // namespace

}  // namespace gptoss::cuda
