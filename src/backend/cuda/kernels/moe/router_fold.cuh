#pragma once
// The router folded into o_proj at 1-8 tokens (RouterFold, kernels.h): the device side both ends
// share. o_proj's blocks add partial sums into RouterFold::acc (fold_add_partials); the expert
// kernels route from those sums (fold_route_warp). Why: the router's own launch costs ~7 us of a
// 120b layer inside the graphed step (twenty-eighth session: running it in layer 0 only took
// 120b fp8 tg64 from 499 to 570 tok/s), most of it the chain of launches and cluster barriers
// between o_proj's last row and gate_up's first weight load, not its 0.7 MB of weights. The
// sixteenth session's fold routed in o_proj's last block and lost to that serial tail; here
// nobody routes alone: each expert block routes for itself from 129 sums in L2.
//
// Fixed point: a block's partial logit goes in as round(v * 2^32) and its partial sum of squares
// as round(v * 2^24), added as 64-bit integers. Integer sums are exact and order-free, so gate_up
// and down (different kernels, different times) read the same bits and pick the same experts.
// Range: |logit sum| < 2^31 before the RMS scale, sum of squares < 2^39 (an RMS of x up to
// ~13,000 at H = 2880); resolution 2^-32 and 2^-24, far below fp32's rounding of such sums.
#include <cstdint>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/moe/route_sort.cuh"

namespace gptoss::cuda::router_fold {

constexpr float kLogitScale = 4294967296.f;  // 2^32
constexpr float kSsScale = 16777216.f;       // 2^24
constexpr int kLaneExperts = kRouterFoldMaxE / 32;

// Shared memory a folding o_proj block stages beside its weights: its rows' router weights
// ([rows][E] bf16) and norm weights ([rows] f32).
__host__ __device__ constexpr size_t stage_bytes(int rows, int E) { return size_t(rows) * E * 2 + size_t(rows) * 4; }

__device__ __forceinline__ void add_fixed(long long* dst, float v, float scale) {
  const long long q = __float2ll_rn(v * scale);  // saturates past the range (documented above)
  atomicAdd(reinterpret_cast<unsigned long long*>(dst), static_cast<unsigned long long>(q));
}
// A logit-scaled fixed-point sum back to float (the folded combine's MoE output, x 2^-32).
__device__ __forceinline__ float from_fixed_logit(long long q) { return __ll2float_rn(q) * (1.f / kLogitScale); }

// Every thread of an o_proj block, once its rows of the new residual are final: xg_s[t][r] = x *
// norm_w and sq_s[t][r] = x^2 of its `rows` rows for each of the pass's ntok tokens, w_s their
// router weights [rows][E] (bf16 bits), part ntok * blockDim.x floats of free shared memory. Adds
// the block's partial logits (rows summed in a fixed order per thread, the threads' parts in thread
// order) and its sums of squares into f.acc ([t][E + 1]). blockDim.x >= E; ntok <= CAP (the
// launch's fold capacity, kernels.h).
template <int CAP>
__device__ __forceinline__ void fold_add_partials(const RouterFold& f, int rows, int ntok, const float* xg_s,
                                                  const float* sq_s, const uint16_t* w_s, float* part) {
  const int E = f.E, tid = threadIdx.x, nq = blockDim.x / E;
  if (tid < nq * E) {
    const int q = tid / E, e = tid - q * E;
    float s[CAP] = {};
    for (int r = q; r < rows; r += nq) {
      const float w = bf16_bits_to_f32(w_s[r * E + e]);
#pragma unroll
      for (int t = 0; t < CAP; ++t)
        if (t < ntok) s[t] = fmaf(xg_s[t * rows + r], w, s[t]);
    }
#pragma unroll
    for (int t = 0; t < CAP; ++t)
      if (t < ntok) part[(t * nq + q) * E + e] = s[t];
  }
  __syncthreads();
  for (int i = tid; i < ntok * E; i += blockDim.x) {
    const int t = i / E, e = i - t * E;
    float s = 0.f;
    for (int q = 0; q < nq; ++q) s += part[(t * nq + q) * E + e];
    add_fixed(f.acc + t * (E + 1) + e, s, kLogitScale);
  }
  if (tid >= blockDim.x - ntok) {  // (threads past the logits' first round where ntok * E <= blockDim.x)
    const int t = tid - (blockDim.x - ntok);
    float s = 0.f;
    for (int r = 0; r < rows; ++r) s += sq_s[t * rows + r];
    add_fixed(f.acc + t * (E + 1) + E, s, kSsScale);
  }
}

// The pass's real tokens: those before RouterFold::n_valid (a graph bucket's padding takes no
// pair), or all n; counted as the router counts them (route_sort.cuh).
__device__ __forceinline__ int real_tokens(const RouterFold& f) { return real_token_count(f.n_valid, f.n); }

// One token's routing, lane j < k of the routing warp holding selection j (j = 0 the largest
// logit): its expert, its softmax weight (when asked for) and its slot among the selected sorted by
// expert (the sorted pair it becomes, where the pass has one token).
struct FoldPick {
  int e = 0;
  float w = 0.f;
  int slot = 0;
};

// One token's sums as a lane of the routing warp holds them (experts lane + 32 i), with the
// router's bias (the copy o_proj's block 0 leaves in L2): fold_load_sums issues the loads and
// fold_route_sums uses them, so a caller can put other requests between the two.
struct FoldSums {
  long long v[kLaneExperts];
  float b[kLaneExperts];
  long long ss;
};
__device__ __forceinline__ void fold_load_sums(const RouterFold& f, int t, FoldSums& s) {
  const int lane = threadIdx.x & 31, E = f.E;
  const long long* acc = f.acc + t * (E + 1);
#pragma unroll
  for (int i = 0; i < kLaneExperts; ++i) {
    const bool in = lane + 32 * i < E;
    s.v[i] = in ? __ldcg(acc + lane + 32 * i) : 0;
    s.b[i] = in ? __ldcg(f.bias_l2 + lane + 32 * i) : 0.f;
  }
  s.ss = __ldcg(acc + E);
}

// All 32 lanes of one warp, once acc is complete (after the wait that follows o_proj, or two
// launches later) and its sums loaded (fold_load_sums): the logits from the fixed-point sums (RMS
// scale, then the bias), top-k (ties to the lower expert, as moe_route and the CPU), softmax over
// the k by topk_softmax's formula (each lane sums the k exponentials in selection order, so the
// weights are the decode router's and moe_route's bits for the same logits). Registers only (every
// index static). Explicitly rounded operations, so every kernel that inlines this picks the same
// experts. inv_rms: the residual's RMS scale. keys_clock (diagnostic builds): stamped once the
// sums are in.
__device__ __forceinline__ FoldPick fold_route_sums(const RouterFold& f, const FoldSums& s, bool weights, float& inv_rms,
                                                    long long* keys_clock = nullptr) {
  const int lane = threadIdx.x & 31, E = f.E, k = f.k;
  const float mean = __fdiv_rn(__fmul_rn(__ll2float_rn(s.ss), 1.f / kSsScale), float(f.H));
  inv_rms = rsqrtf(__fadd_rn(mean, f.eps));
  const float scale = __fmul_rn(inv_rms, 1.f / kLogitScale);
  uint32_t key[kLaneExperts];
#pragma unroll
  for (int i = 0; i < kLaneExperts; ++i)
    key[i] = lane + 32 * i < E ? order_key(__fadd_rn(__fmul_rn(__ll2float_rn(s.v[i]), scale), s.b[i])) : 0u;
  if (keys_clock) {
    asm volatile("" ::"r"(key[0]), "r"(key[kLaneExperts - 1]) : "memory");
    *keys_clock = clock64();
  }
  float sel_v[kMaxTopK];
  int sel_e[kMaxTopK];
  warp_top_k<kLaneExperts>(key, k, sel_v, sel_e);
  FoldPick p;
  float my_v = 0.f;
#pragma unroll
  for (int j = 0; j < kMaxTopK; ++j)
    if (j < k && j == lane) {
      p.e = sel_e[j];
      my_v = sel_v[j];
    }
#pragma unroll
  for (int j = 0; j < kMaxTopK; ++j)
    if (j < k) p.slot += sel_e[j] < p.e;
  if (weights) p.w = lane < k ? expf(my_v - sel_v[0]) / topk_exp_sum(sel_v, k) : 0.f;  // (topk_softmax's formula)
  return p;
}

// fold_load_sums then fold_route_sums.
__device__ __forceinline__ FoldPick fold_route_warp(const RouterFold& f, int t, bool weights, float& inv_rms) {
  FoldSums s;
  fold_load_sums(f, t, s);
  return fold_route_sums(f, s, weights, inv_rms);
}

// gate_up's block 0, lane j < k of the routing warp (its FoldPick): the routing arrays the combine
// reads (topk_w, slot_pair) and the rest of what moe_route would leave for one token, so nothing
// downstream sees stale groups.
__device__ __forceinline__ void fold_write_routing(const MoeRouting& r, int j, int k, const FoldPick& p) {
  const int s = p.slot;
  r.topk_idx[j] = p.e;
  r.topk_w[j] = p.w;
  r.slot_pair[j] = s;
  r.pair_token[s] = 0;
  r.pair_weight[s] = p.w;
  r.group_expert[s] = p.e;
  r.group_start[s] = s;
  r.group_end[s] = s + 1;
  r.tile_group[s] = s;
  r.tile_row[s] = s;
  if (j == 0) {
    r.counts[0] = k;
    r.counts[1] = k;
  }
}

}  // namespace gptoss::cuda::router_fold
