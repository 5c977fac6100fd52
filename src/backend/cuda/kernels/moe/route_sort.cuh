#pragma once
// Sorting a batch's (token, expert) pairs by expert on the device, shared by the routing kernels
// of route.cu and the decode router of route_decode.cu. The token-order top-k (idx, wts) may lie
// in global or shared memory (generic pointers).
#include <cstdint>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"

namespace gptoss::cuda {

constexpr int kMaxExpertsPerLane = 8;  // E <= 256
constexpr int kMaxTopK = 8;

// A graph bucket's real tokens: those before *n_valid (the rest are padding), or all n when null.
__device__ __forceinline__ int real_token_count(const int32_t* n_valid, int n) {
  return n_valid ? max(0, min(n, *n_valid)) : n;
}
// The pairs a fused decode router sorts: those of the real tokens (MoeRouting::n_valid). Padding
// pairs take no group; clear_padding_slots points their slots at sorted pair 0 so the combine reads
// a written row. Called by thread t of T (a block's threads).
__device__ __forceinline__ int routed_pairs(const MoeRouting& r, int n, int k) { return real_token_count(r.n_valid, n) * k; }
__device__ __forceinline__ void clear_padding_slots(const MoeRouting& r, int P, int all_pairs, int t, int T) {
  for (int p = P + t; p < all_pairs; p += T) r.slot_pair[p] = 0;
}

// Steps the sorts share: count each expert's pairs into cnt[E] (shared memory)...
__device__ __forceinline__ void count_expert_pairs(int P, int E, const int32_t* idx, int32_t* cnt) {
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < P; p += blockDim.x) atomicAdd(&cnt[idx[p]], 1);
  __syncthreads();
}
// ... write held expert `held`'s group g (c pairs from sorted slot off) and its nt GEMM row tiles
// from tile t0 ...
__device__ __forceinline__ void write_group(const MoeRouting& r, int g, int held, int off, int c, int t0, int nt) {
  r.group_expert[g] = held;
  r.group_start[g] = off;
  r.group_end[g] = off + c;
  for (int i = 0; i < nt; ++i) {
    r.tile_group[t0 + i] = g;
    r.tile_row[t0 + i] = off + i * kGemmBM;
  }
}
// ... and, once cursor[e] holds each expert's first sorted slot, give every pair its slot (pairs
// of one expert take its slots in atomic order).
__device__ __forceinline__ void scatter_pairs(int P, int k, const MoeRouting& r, const int32_t* idx, const float* wts,
                                              int32_t* cursor) {
  for (int p = threadIdx.x; p < P; p += blockDim.x) {
    const int e = idx[p];
    const int dst = atomicAdd(&cursor[e], 1);
    r.pair_token[dst] = p / k;
    r.pair_weight[dst] = wts[p];
    r.slot_pair[p] = dst;
  }
}

// One block (blockDim.x >= E): counts per expert, exclusive scans for the sorted offsets, the
// groups of the held experts [eb, ee) and their GEMM row tiles, then each pair's slot (pairs of
// one expert take its slots in atomic order). sm: 5 * E ints of shared memory.
__device__ inline void moe_sort_block(int P, int E, int k, const MoeRouting& r, int eb, int ee,
                                      const int32_t* idx, const float* wts, int32_t* sm) {
  int32_t* cnt = sm;         // [E]
  int32_t* cursor = sm + E;  // [E]
  count_expert_pairs(P, E, idx, cnt);
  // Exclusive scans over experts (one thread each, E <= 1024): row offsets, group slots of
  // the non-empty experts, GEMM row tiles.
  int32_t* s_off = sm + 2 * E;    // [E]
  int32_t* s_grp = sm + 3 * E;    // [E]
  int32_t* s_tile = sm + 4 * E;   // [E]
  const int e = threadIdx.x;
  // Every expert's pairs take sorted slots (c_all); only held experts get groups and tiles (c).
  const int c_all = e < E ? cnt[e] : 0;
  const int c = e >= eb && e < ee ? c_all : 0;
  int nt = (c + kGemmBM - 1) / kGemmBM;
  if (e < E) { s_off[e] = c_all; s_grp[e] = c > 0; s_tile[e] = nt; }
  __syncthreads();
  for (int d = 1; d < E; d *= 2) {  // Hillis-Steele inclusive scans
    int a0 = 0, a1 = 0, a2 = 0;
    if (e < E && e >= d) { a0 = s_off[e - d]; a1 = s_grp[e - d]; a2 = s_tile[e - d]; }
    __syncthreads();
    if (e < E && e >= d) { s_off[e] += a0; s_grp[e] += a1; s_tile[e] += a2; }
    __syncthreads();
  }
  if (e < E) {
    int off = s_off[e] - c_all, g = s_grp[e] - (c > 0), t0 = s_tile[e] - nt;
    cursor[e] = off;
    if (c > 0) write_group(r, g, e - eb, off, c, t0, nt);
    if (e == E - 1) {
      r.counts[0] = s_grp[e];
      r.counts[1] = s_tile[e];
    }
  }
  __syncthreads();
  scatter_pairs(P, k, r, idx, wts, cursor);
}

// moe_sort_block's result with the scans over experts done by one warp (a run of E / 32 experts
// per lane, then warp shuffles): three block barriers instead of 2 log2(E) + 3. blockDim.x >= 32,
// E <= 32 * kMaxExpertsPerLane. sm: 2 * E ints of shared memory.
__device__ inline void moe_sort_block_warp_scan(int P, int E, int k, const MoeRouting& r, int eb, int ee,
                                                const int32_t* idx, const float* wts, int32_t* sm) {
  int32_t* cnt = sm;         // [E]
  int32_t* cursor = sm + E;  // [E]
  count_expert_pairs(P, E, idx, cnt);
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x, per = (E + 31) / 32, e0 = lane * per;
    // This lane's totals: sorted rows of all its experts, groups and GEMM tiles of the held ones.
    int off = 0, grp = 0, til = 0;
    for (int i = 0; i < per; ++i) {
      const int e = e0 + i;
      if (e < E) {
        const int c_all = cnt[e], c = e >= eb && e < ee ? c_all : 0;
        off += c_all;
        grp += c > 0;
        til += (c + kGemmBM - 1) / kGemmBM;
      }
    }
    int ioff = off, igrp = grp, itil = til;  // inclusive scans over the lanes
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int o = __shfl_up_sync(0xffffffffu, ioff, d), g = __shfl_up_sync(0xffffffffu, igrp, d),
                t = __shfl_up_sync(0xffffffffu, itil, d);
      if (lane >= d) { ioff += o; igrp += g; itil += t; }
    }
    int xo = ioff - off, xg = igrp - grp, xt = itil - til;
    for (int i = 0; i < per; ++i) {
      const int e = e0 + i;
      if (e < E) {
        const int c_all = cnt[e], c = e >= eb && e < ee ? c_all : 0, nt = (c + kGemmBM - 1) / kGemmBM;
        cursor[e] = xo;
        if (c > 0) {
          write_group(r, xg, e - eb, xo, c, xt, nt);
          ++xg;
        }
        xo += c_all;
        xt += nt;
      }
    }
    if (lane == 31) {
      r.counts[0] = igrp;
      r.counts[1] = itil;
    }
  }
  __syncthreads();
  scatter_pairs(P, k, r, idx, wts, cursor);
}

// moe_sort_block's result for at most 32 pairs, by one warp and without shared memory or
// barriers: lane p ranks its pair among all (by expert, then pair index), so the groups, tiles
// (one each: a group has at most 32 <= kGemmBM pairs) and slots follow from a match, a ballot and
// one pass of P shuffles.
static_assert(kGemmBM >= 32, "moe_sort_warp: one GEMM tile per group");
__device__ inline void moe_sort_warp(int P, int k, const MoeRouting& r, int eb, int ee, const int32_t* idx,
                                     const float* wts) {
  const int lane = threadIdx.x & 31;
  const int e = lane < P ? idx[lane] : 0x7fffffff;  // lanes past P: a value no expert has
  const float wgt = lane < P ? wts[lane] : 0.f;
  const unsigned same_mask = __match_any_sync(0xffffffffu, e);  // the pairs of this lane's expert
  const int same = __popc(same_mask), same_before = __popc(same_mask & ((1u << lane) - 1u));
  // The first pair of each held expert stands for its group.
  const unsigned firsts = __ballot_sync(0xffffffffu, lane < P && same_before == 0 && e >= eb && e < ee);
  int before = 0, groups_before = 0;
  for (int q = 0; q < P; ++q) {
    const int eq = __shfl_sync(0xffffffffu, e, q);
    before += eq < e;
    groups_before += int((firsts >> q) & 1u) & int(eq < e);
  }
  const int groups = __popc(firsts);
  if (lane < P) {
    const int slot = before + same_before;
    r.pair_token[slot] = lane / k;
    r.pair_weight[slot] = wgt;
    r.slot_pair[lane] = slot;
    if ((firsts >> lane) & 1u) write_group(r, groups_before, e - eb, before, same, groups_before, 1);
  }
  if (lane == 0) {
    r.counts[0] = groups;
    r.counts[1] = groups;
  }
}

// Floats -> unsigned keys in the same order (-0 taken as +0, as float compares do; NaN lowest,
// never chosen while a number is left), so a warp's maximum is one redux instruction.
__device__ __forceinline__ uint32_t order_key(float f) {
  if (f != f) return 0u;
  const uint32_t u = __float_as_uint(f + 0.0f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// warp_top_k for k <= L: each lane keeps its L largest (key, expert) pairs as 64-bit words
// (key << 32 | ~expert, so one unsigned compare orders by key, then by the lower expert; key 0,
// none or NaN, is the word 0), sorted; five butterfly steps merge a lane's list with its partner's
// (the larger of a[j] and b[L-1-j] are the union's L largest, in bitonic order, which a bitonic
// merger sorts), and every lane ends with the warp's L largest. Where the warp's j-th largest is 0
// (nothing but NaN or none left), expert 0 and key 0's value, as the round-by-round form gives.
// Why: the round-by-round form (two warp reductions a selection, one after the other) took ~1,700
// cycles for four of 128 in the one-token fold's routing (H200, s34r2); this takes five rounds of
// independent shuffles.
template <int N, int L>
__device__ __forceinline__ void warp_top_k_merge(const uint32_t (&key)[N], int k, float* sel_v, int* sel_e) {
  using u64 = unsigned long long;
  const int lane = threadIdx.x & 31;
  u64 c[L];
#pragma unroll
  for (int j = 0; j < L; ++j) c[j] = 0ull;
#pragma unroll
  for (int i = 0; i < N; ++i) {  // insertion into the sorted list
    u64 x = key[i] ? (u64(key[i]) << 32) | u64(~uint32_t(lane + 32 * i)) : 0ull;
#pragma unroll
    for (int j = 0; j < L; ++j) {
      const u64 hi = c[j] > x ? c[j] : x;
      x = c[j] > x ? x : c[j];
      c[j] = hi;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    u64 d[L];
#pragma unroll
    for (int j = 0; j < L; ++j) d[j] = __shfl_xor_sync(0xffffffffu, c[L - 1 - j], o);
#pragma unroll
    for (int j = 0; j < L; ++j) c[j] = c[j] > d[j] ? c[j] : d[j];
#pragma unroll
    for (int h = L / 2; h > 0; h /= 2)  // bitonic merger, descending
#pragma unroll
      for (int j = 0; j < L; ++j)
        if ((j & h) == 0) {
          const u64 a = c[j], b = c[j + h];
          c[j] = a > b ? a : b;
          c[j + h] = a > b ? b : a;
        }
  }
#pragma unroll
  for (int j = 0; j < L; ++j)
    if (j < k) {
      const uint32_t hi = uint32_t(c[j] >> 32);
      sel_v[j] = key_value(hi);
      sel_e[j] = hi ? int(~uint32_t(c[j])) : 0;
    }
}

// warp_top_k (below) at any k, one selection a round: the largest key by a warp reduction, then
// the lowest expert holding it by another, removed before the next round.
template <int N>
__device__ __forceinline__ void warp_top_k_rounds(uint32_t (&key)[N], int k, float* sel_v, int* sel_e) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < kMaxTopK; ++j) {
    if (j < k) {
      uint32_t lb = 0u;
      int li = 0x7fffffff;
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (key[i] > lb) { lb = key[i]; li = lane + 32 * i; }
      const uint32_t best = __reduce_max_sync(0xffffffffu, lb);
      int win = int(__reduce_min_sync(0xffffffffu, lb == best ? uint32_t(li) : 0x7fffffffu));
      if (win == 0x7fffffff) win = 0;  // nothing but NaN left: expert 0, as moe_route
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (lane + 32 * i == win) key[i] = 0u;
      sel_v[j] = key_value(best);
      sel_e[j] = win;
    }
  }
}

// One token's top-k over a warp (all 32 lanes): key[i] is expert lane + 32 i's order_key (0 for
// none); sel_v / sel_e get the k largest in order, ties to the lower expert index (as moe_route
// and the CPU), the same in every lane. key is consumed. k <= 4 (gpt-oss): warp_top_k_merge.
template <int N>
__device__ __forceinline__ void warp_top_k(uint32_t (&key)[N], int k, float* sel_v, int* sel_e) {
  if (k <= 4) {
    warp_top_k_merge<N, 4>(key, k, sel_v, sel_e);
    return;
  }
  warp_top_k_rounds(key, k, sel_v, sel_e);
}

// The top-k softmax's denominator alone, the k exponentials summed in selection order (k <=
// kMaxTopK; every index static, so a caller holding sel_v in registers keeps it there: the fold's
// routing).
__device__ __forceinline__ float topk_exp_sum(const float* sel_v, int k) {
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < kMaxTopK; ++j)
    if (j < k) sum += expf(sel_v[j] - sel_v[0]);
  return sum;
}
// Top-k softmax weights of one token from its selected logits (sel_v[0] the largest), written in
// selection order: the formula moe_route and both decode routers share, so their weights agree
// bit for bit on the same logits.
__device__ inline void topk_softmax(const float* sel_v, int k, float* w) {
  const float m = sel_v[0], sum = topk_exp_sum(sel_v, k);
  for (int j = 0; j < k; ++j) w[j] = expf(sel_v[j] - m) / sum;
}

}  // namespace gptoss::cuda
