// MoE routing (top-k, softmax, pairs sorted by expert) and the fixed-order weighted sum of
// the experts' outputs (moe_combine).
#include <cooperative_groups.h>

#include <cstdio>
#include <string>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/kv_layout.h"

namespace gptoss::cuda {

// MoE routing: top-k per token (one warp each), then one block sorts the pairs by expert and
// lays out the GEMM row tiles, all on the device so a decode step needs no host sync.

size_t moe_routing_bytes(int max_pairs, int E) {
  size_t ints = 2 + 3 * size_t(E) + 2 * size_t(moe_max_tiles(max_pairs, E)) + 3 * size_t(max_pairs);
  size_t floats = 2 * size_t(max_pairs);
  return (ints + floats) * 4 + 64;
}

MoeRouting moe_routing_carve(void* mem, int max_pairs, int E) {
  MoeRouting r;
  int32_t* p = static_cast<int32_t*>(mem);
  int tiles = moe_max_tiles(max_pairs, E);
  r.counts = p; p += 2;
  r.group_expert = p; p += E;
  r.group_start = p; p += E;
  r.group_end = p; p += E;
  r.tile_group = p; p += tiles;
  r.tile_row = p; p += tiles;
  r.pair_token = p; p += max_pairs;
  r.topk_idx = p; p += max_pairs;
  r.pair_weight = reinterpret_cast<float*>(p); p += max_pairs;
  r.topk_w = reinterpret_cast<float*>(p); p += max_pairs;
  r.slot_pair = p;
  return r;
}

constexpr int kMaxExpertsPerLane = 8;  // E <= 256
constexpr int kMaxTopK = 8;

__device__ void topk_token(const float* __restrict__ logits, int t, int E, int k, const MoeRouting& r) {
  int lane = threadIdx.x & 31;
  float v[kMaxExpertsPerLane];
#pragma unroll
  for (int i = 0; i < kMaxExpertsPerLane; ++i) {
    int e = lane + 32 * i;
    v[i] = e < E ? logits[size_t(t) * E + e] : -INFINITY;
  }
  float sel_v[kMaxTopK];
  int sel_i[kMaxTopK];
  for (int j = 0; j < k; ++j) {
    float best = -INFINITY;
    int bi = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < kMaxExpertsPerLane; ++i) {
      int e = lane + 32 * i;
      if (e < E && (v[i] > best || (v[i] == best && e < bi))) { best = v[i]; bi = e; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      float ob = __shfl_xor_sync(0xffffffffu, best, o);
      int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ob > best || (ob == best && oi < bi)) { best = ob; bi = oi; }
    }
    if (bi == 0x7fffffff) bi = 0;  // all -inf or NaN: fall back to expert 0
#pragma unroll
    for (int i = 0; i < kMaxExpertsPerLane; ++i)
      if (lane + 32 * i == bi) v[i] = -INFINITY;
    if (j < kMaxTopK) { sel_v[j] = best; sel_i[j] = bi; }
  }
  if (lane == 0) {
    float m = sel_v[0], sum = 0.f;
    for (int j = 0; j < k; ++j) sum += expf(sel_v[j] - m);
    for (int j = 0; j < k; ++j) {
      r.topk_idx[t * k + j] = sel_i[j];
      r.topk_w[t * k + j] = expf(sel_v[j] - m) / sum;
    }
  }
}

__global__ void topk_kernel(const float* __restrict__ logits, int n, int E, int k, MoeRouting r) {
  pdl_begin();
  int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (t < n) topk_token(logits, t, E, k, r);
}

__device__ void moe_sort_block(int P, int E, int k, const MoeRouting& r, int eb, int ee) {
  extern __shared__ int32_t sm[];
  int32_t* cnt = sm;         // [E]
  int32_t* cursor = sm + E;  // [E]
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < P; p += blockDim.x) atomicAdd(&cnt[r.topk_idx[p]], 1);
  __syncthreads();
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
    if (c > 0) {
      r.group_expert[g] = e - eb;
      r.group_start[g] = off;
      r.group_end[g] = off + c;
      for (int i = 0; i < nt; ++i) {
        r.tile_group[t0 + i] = g;
        r.tile_row[t0 + i] = off + i * kGemmBM;
      }
    }
    if (e == E - 1) {
      r.counts[0] = s_grp[e];
      r.counts[1] = s_tile[e];
    }
  }
  __syncthreads();
  for (int p = threadIdx.x; p < P; p += blockDim.x) {
    int e = r.topk_idx[p];
    int dst = atomicAdd(&cursor[e], 1);
    r.pair_token[dst] = p / k;
    r.pair_weight[dst] = r.topk_w[p];
    r.slot_pair[p] = dst;
  }
}

__global__ void moe_sort_kernel(int P, int E, int k, MoeRouting r, int eb, int ee) {
  pdl_begin();
  moe_sort_block(P, E, k, r, eb, ee);
}

// Decode-sized batches: top-k and the sort in one launch (one block), a launch less per layer.
__global__ void moe_route_small_kernel(const float* __restrict__ logits, int n, int E, int k, MoeRouting r, int eb,
                                       int ee) {
  pdl_begin();
  for (int t = threadIdx.x / 32; t < n; t += blockDim.x / 32) topk_token(logits, t, E, k, r);
  __threadfence_block();
  __syncthreads();
  moe_sort_block(n * k, E, k, r, eb, ee);
}

void moe_route(const float* logits, int n, int E, int k, const MoeRouting& r, cudaStream_t s, int eb, int ee) {
  if (n <= 0) return;
  if (ee < 0) ee = E;
  if (eb < 0 || eb >= ee || ee > E) throw Error("moe_route: bad expert range");
  if (E > 32 * kMaxExpertsPerLane || k > kMaxTopK || k > E) throw Error("moe_route: unsupported experts/top-k");
  if (n <= 64) {
    launch_pdl(moe_route_small_kernel, dim3(1), dim3(1024), 5 * E * sizeof(int32_t), s, logits, n, E, k, r, eb, ee);
    GPTOSS_CUDA_LAUNCH_CHECK();
    return;
  }
  launch_pdl(topk_kernel, dim3((n + 7) / 8), dim3(256), 0, s, logits, n, E, k, r);
  GPTOSS_CUDA_LAUNCH_CHECK();
  launch_pdl(moe_sort_kernel, dim3(1), dim3(1024), 5 * E * sizeof(int32_t), s, n * k, E, k, r, eb, ee);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

// A cluster of kCombineBlocks blocks per token, each over a slice of the row: the k expert
// outputs added in order j = 0..k-1 (no atomics, so a token's sum does not depend on which expert
// finished first), then the next layer's RMSNorm, its sum of squares met through distributed
// shared memory (one SM alone would serialize the row's loads: 5.7 us at one token).
constexpr int kCombineBlocks = 8, kCombineThreads = 128;

__global__ void __cluster_dims__(kCombineBlocks, 1, 1) __launch_bounds__(kCombineThreads)
    moe_combine_kernel(const float* __restrict__ y, MoeRouting r, int k, int H, float* __restrict__ x,
                       const float* __restrict__ norm_w, float eps, uint16_t* __restrict__ xn) {
  pdl_begin();
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank());
  const int t = blockIdx.x / kCombineBlocks;
  const int per = (H + kCombineBlocks - 1) / kCombineBlocks;
  const int h0 = rank * per, h1 = min(H, h0 + per);
  float* xr = x + size_t(t) * H;
  int slot[kMaxTopK];
  float w[kMaxTopK];
  for (int j = 0; j < k; ++j) {
    slot[j] = r.slot_pair[t * k + j];
    w[j] = r.topk_w[t * k + j];
  }
  float ss = 0.f;
  for (int h = h0 + threadIdx.x; h < h1; h += blockDim.x) {
    float sum = 0.f;
    for (int j = 0; j < k; ++j) sum = fmaf(w[j], y[size_t(slot[j]) * H + h], sum);
    const float v = xr[h] + sum;
    xr[h] = v;
    ss += v * v;
  }
  if (!norm_w) return;  // uniform over the cluster
  __shared__ float red[kCombineThreads / 32];
  __shared__ float block_ss;
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    float b = 0.f;
    for (int i = 0; i < kCombineThreads / 32; ++i) b += red[i];
    block_ss = b;
  }
  cluster.sync();  // every block's partial sum is in its block_ss
  float total = 0.f;
  for (int b = 0; b < kCombineBlocks; ++b) total += *cluster.map_shared_rank(&block_ss, b);  // same order everywhere
  const float inv = 1.0f / sqrtf(total / float(H) + eps);
  for (int h = h0 + threadIdx.x; h < h1; h += blockDim.x) xn[size_t(t) * H + h] = f32_to_bf16_bits(xr[h] * inv * norm_w[h]);
  cluster.sync();  // the others' shared memory stays alive until all have read it
}

void moe_combine(const float* y, const MoeRouting& r, int n, int k, int H, float* x, const float* norm_w, float eps,
                 bf16_t* xn, cudaStream_t s) {
  if (n <= 0) return;
  if (k > kMaxTopK) throw Error("moe_combine: top-k too large");
  launch_pdl(moe_combine_kernel, dim3(n * kCombineBlocks), dim3(kCombineThreads), 0, s, y, r, k, H, x, norm_w, eps,
             xn);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda
