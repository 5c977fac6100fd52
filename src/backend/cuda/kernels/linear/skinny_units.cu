// The unit-walking grouped decode kernels: MXFP4 experts at 1-64 tokens (one n-tile: <= 8 of a
// group's tokens a pass), over a grid the size of the GPU. Two ways to split a unit among a
// block's warps: skinny_units_kernel (a K slice of every row tile a warp, the slices reduced
// through shared memory) and skinny_warp_units_kernel (whole row tiles a warp, no reduction).
// The per-chunk math is skinny_chunk.cuh's, shared with skinny_mma.cu, so each row's sums match
// the block-per-tile kernel's with the same split bit for bit; the steps around it (routing scans,
// a unit's loads and chunk loop) are skinny_units_device.cuh's.
#include "backend/cuda/kernels/linear/skinny_units.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>
#include <utility>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/diag_clocks.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/linear/frag_layout.cuh"
#include "backend/cuda/kernels/linear/skinny_units_device.cuh"
#include "backend/cuda/kernels/moe/router_fold.cuh"
#include "backend/cuda/tensor_core_ptx.cuh"

namespace gptoss::cuda {

namespace {

using namespace skinny;

#ifdef GPTOSS_DIAG_UNITS_CLOCKS
void print_units_clocks() {
  static const char* const kinds[3] = {"gate_up (fold)", "down (fold)", "other"};
  static const char* const names[5] = {"start->waited", "->routed", "->loop begins", "first unit's chunks", "->end"};
  print_stage_table("units", g_units_clocks, kinds, names, 5);
  static const char* const rkinds[2] = {"gate_up", "down"};
  static const char* const rnames[4] = {"->issued", "->sums in", "->top-k", "->met"};
  print_stage_table("fold route (one token)", g_fold_route_clocks, rkinds, rnames, 4);
}
#endif

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

// The walk's ring refilled a slot at a time (1), or LG slots at once after the LG-th is used: a
// measurement knob, set only in diagnostic builds (tools/gpu/diag_binary.sh ...
// GPTOSS_DIAG_WALK_LOAD_GROUP=4).
#ifndef GPTOSS_DIAG_WALK_LOAD_GROUP
#define GPTOSS_DIAG_WALK_LOAD_GROUP 1
#endif
constexpr int kWalkLoadGroup = GPTOSS_DIAG_WALK_LOAD_GROUP;

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
// (The ring in shared memory instead, filled by cp.async, 8, 12 or 14 chunk steps deep, was slower
// on the H200 at every depth, in bench-kernels and in the step: fifty-first session, branch
// s49-smem-ring.)
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
#ifdef GPTOSS_DIAG_WALK_NO_ACT
            // Diagnostic builds only: no shared-memory reads of the activations (garbage sums), to
            // time the walk without them.
            x[i][0] = make_uint4(0x3c003c00u ^ c, 0x3c003c00u ^ lane, 0x3c003c00u, 0x3c003c00u);
            x[i][1] = x[i][0];
#else
            const uint4* p = reinterpret_cast<const uint4*>(xs_lane + size_t(8 * i) * xs_ld + c * 64);
            x[i][0] = p[0];
            x[i][1] = p[4];
#endif
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
      // Every turn but the last: chunk base + v, then its slot takes chunk base + v + PF (LG > 1, a
      // measurement build's GPTOSS_DIAG_WALK_LOAD_GROUP: the slots refilled LG at a time, after
      // the LG-th of them is used, so that a warp asks for LG adjacent chunks at once).
      constexpr int LG = PF % kWalkLoadGroup == 0 ? kWalkLoadGroup : 1;
#pragma unroll 1
      for (int base = 0; base < CP - PF; base += PF) {
#pragma unroll
        for (int v = 0; v < PF; ++v) {
          chunk(base + v, wbuf[v], acc);
          if ((v + 1) % LG == 0)
#pragma unroll
            for (int j = v + 1 - LG; j <= v; ++j)
              if (base + j + PF < C)
#pragma unroll
                for (int r = 0; r < RTW; ++r) load_w_at<FMT, kExpertWeightLoad>(w, sc, r * CC + j + PF, wbuf[j][r]);
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

}  // namespace skinny

}  // namespace gptoss::cuda
