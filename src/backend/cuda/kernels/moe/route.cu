// MoE routing (top-k, softmax, pairs sorted by expert) and the fixed-order weighted sum of
// the experts' outputs (moe_combine).
#include <algorithm>
#include <cstdio>
#include <string>

#include "backend/cuda/cluster.cuh"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/moe/route_decode.h"
#include "backend/cuda/kernels/moe/route_sort.cuh"
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
    float w[kMaxTopK];
    topk_softmax(sel_v, k, w);
    for (int j = 0; j < k; ++j) {
      r.topk_idx[t * k + j] = sel_i[j];
      r.topk_w[t * k + j] = w[j];
    }
  }
}

__global__ void topk_kernel(const float* __restrict__ logits, int n, int E, int k, MoeRouting r) {
  pdl_begin();
  int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (t < n) topk_token(logits, t, E, k, r);
}

__global__ void moe_sort_kernel(int P, int E, int k, MoeRouting r, int eb, int ee) {
  pdl_begin();
  extern __shared__ int32_t sm[];
  moe_sort_block(P, E, k, r, eb, ee, r.topk_idx, r.topk_w, sm);
}

// Decode-sized batches: top-k and the sort in one launch (one block), a launch less per layer.
__global__ void moe_route_small_kernel(const float* __restrict__ logits, int n, int E, int k, MoeRouting r, int eb,
                                       int ee) {
  pdl_begin();
  for (int t = threadIdx.x / 32; t < n; t += blockDim.x / 32) topk_token(logits, t, E, k, r);
  __threadfence_block();
  __syncthreads();
  extern __shared__ int32_t sm[];
  moe_sort_block(n * k, E, k, r, eb, ee, r.topk_idx, r.topk_w, sm);
}

namespace {
// A warp a row of E keys (order_key words; 0 = none or NaN): warp_top_k's selection for k <= 4
// (warp_top_k_merge) or the round-by-round form, for the test that holds them equal.
template <bool MERGE>
__global__ void warp_top_k_probe_kernel(const uint32_t* keys, int E, int k, int* sel_e, float* sel_v) {
  const int lane = threadIdx.x, row = blockIdx.x;
  uint32_t key[kMaxExpertsPerLane];
#pragma unroll
  for (int i = 0; i < kMaxExpertsPerLane; ++i) key[i] = lane + 32 * i < E ? keys[size_t(row) * E + lane + 32 * i] : 0u;
  float v[kMaxTopK];
  int e[kMaxTopK];
  if constexpr (MERGE)
    warp_top_k_merge<kMaxExpertsPerLane, 4>(key, k, v, e);
  else
    warp_top_k_rounds(key, k, v, e);
  if (lane == 0)
    for (int j = 0; j < k; ++j) {
      sel_e[row * k + j] = e[j];
      sel_v[row * k + j] = v[j];
    }
}
}  // namespace

void warp_top_k_probe(const uint32_t* keys, int rows, int E, int k, bool merge, int* sel_e, float* sel_v) {
  if (E > 32 * kMaxExpertsPerLane || k < 1 || k > 4) throw Error("warp_top_k_probe: E <= 256, k in 1..4");
  if (merge)
    warp_top_k_probe_kernel<true><<<rows, 32>>>(keys, E, k, sel_e, sel_v);
  else
    warp_top_k_probe_kernel<false><<<rows, 32>>>(keys, E, k, sel_e, sel_v);
  GPTOSS_CUDA_CHECK(cudaGetLastError());
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

// Decode: the router's RMSNorm + GEMV and the routing in one launch. Each warp owns one expert's
// router row (loaded before griddepcontrol.wait: weights depend on no earlier kernel); every block
// normalizes the tokens' rows into shared memory exactly as rmsnorm_kernel rounds them (block 0
// also leaves them in xn for the experts); the last block to finish (a ticket counter, reset by
// that block for the next launch) reads all logits back and runs top-k and the sort of
// moe_route_small_kernel. One launch and one dependent round trip less per layer than
// linear_rmsnorm + moe_route.
struct RouterRouteArgs : RouterIo {
  int* ticket;
};

constexpr int kRouterMaxTokens = 8;

template <int KC>  // 16-byte chunks of a router row per lane: K <= KC * 256
__global__ void __launch_bounds__(256) router_route_kernel(RouterRouteArgs a) {
  extern __shared__ __align__(16) int32_t sm[];
  uint4* xs = reinterpret_cast<uint4*>(sm);  // [n][K / 8] normalized bf16 rows
  __shared__ float inv_rms[kRouterMaxTokens];
  __shared__ bool last;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, warps = blockDim.x / 32;
  const int row = blockIdx.x * warps + warp, K = a.K, chunks = K / 8, n = a.n;
  uint4 w[KC];
  if (row < a.E) {
    const uint4* wr = reinterpret_cast<const uint4*>(a.w) + size_t(row) * chunks;
#pragma unroll
    for (int u = 0; u < KC; ++u)
      if (lane + 32 * u < chunks) w[u] = __ldg(wr + lane + 32 * u);
  }
  pdl_wait();
  pdl_trigger();
  // Sums of squares with every thread's loads in flight at once (a warp walking the row alone
  // would wait on L2 once per 512 bytes), then a fixed-order sum over the warps.
  __shared__ float red[kRouterMaxTokens][8];
  for (int m = 0; m < n; ++m) {
    const float4* xr = reinterpret_cast<const float4*>(a.x + size_t(m) * K);
    float ss = 0.f;
#pragma unroll 8
    for (int i = threadIdx.x; i < K / 4; i += blockDim.x) {
      const float4 v = xr[i];
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    ss = warp_sum(ss);
    if (lane == 0) red[m][warp] = ss;
  }
  __syncthreads();
  if (threadIdx.x < n) {
    float ss = 0.f;
    for (int w2 = 0; w2 < warps; ++w2) ss += red[threadIdx.x][w2];
    inv_rms[threadIdx.x] = 1.0f / sqrtf(ss / float(K) + a.eps);
  }
  __syncthreads();
#pragma unroll 4
  for (int i = threadIdx.x; i < n * chunks; i += blockDim.x) {
    const int m = i / chunks, c = i % chunks;
    const float inv = inv_rms[m];
    const float4* xr = reinterpret_cast<const float4*>(a.x + size_t(m) * K + size_t(c) * 8);
    const float4* nr = reinterpret_cast<const float4*>(a.norm_w + size_t(c) * 8);
    const float4 x0 = xr[0], x1 = xr[1], w0 = __ldg(nr), w1 = __ldg(nr + 1);
    uint4 v;
    v.x = uint32_t(f32_to_bf16_bits(x0.x * inv * w0.x)) | (uint32_t(f32_to_bf16_bits(x0.y * inv * w0.y)) << 16);
    v.y = uint32_t(f32_to_bf16_bits(x0.z * inv * w0.z)) | (uint32_t(f32_to_bf16_bits(x0.w * inv * w0.w)) << 16);
    v.z = uint32_t(f32_to_bf16_bits(x1.x * inv * w1.x)) | (uint32_t(f32_to_bf16_bits(x1.y * inv * w1.y)) << 16);
    v.w = uint32_t(f32_to_bf16_bits(x1.z * inv * w1.z)) | (uint32_t(f32_to_bf16_bits(x1.w * inv * w1.w)) << 16);
    xs[i] = v;
    if (a.xn && blockIdx.x == 0) reinterpret_cast<uint4*>(a.xn)[i] = a.xn_f16 ? bf16x8_to_f16x8(v) : v;
  }
  __syncthreads();
  if (row < a.E) {
    float acc[kRouterMaxTokens];
#pragma unroll
    for (int m = 0; m < kRouterMaxTokens; ++m) acc[m] = 0.f;
#pragma unroll
    for (int u = 0; u < KC; ++u) {
      const int c = lane + 32 * u;
      if (c >= chunks) break;
      const uint32_t* pw = reinterpret_cast<const uint32_t*>(&w[u]);
#pragma unroll
      for (int m = 0; m < kRouterMaxTokens; ++m) {
        if (m >= n) break;
        const uint4 xv = xs[m * chunks + c];
        const uint32_t* px = reinterpret_cast<const uint32_t*>(&xv);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float2 xf = bf16x2_to_f32x2(px[q]), wf = bf16x2_to_f32x2(pw[q]);
          acc[m] = fmaf(wf.x, xf.x, fmaf(wf.y, xf.y, acc[m]));
        }
      }
    }
    const float b = a.bias ? a.bias[row] : 0.f;
#pragma unroll
    for (int m = 0; m < kRouterMaxTokens; ++m) {
      if (m >= n) break;
      const float v = warp_sum(acc[m]);
      if (lane == 0) a.logits[size_t(m) * a.E + row] = v + b;
    }
  }
  // Every block's logits are stored and fenced before its ticket; the last ticket routes.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(a.ticket, 1) == int(gridDim.x) - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  float* slog = reinterpret_cast<float*>(sm + 5 * a.E);  // after moe_sort_block's scratch
  for (int i = threadIdx.x; i < n * a.E; i += blockDim.x) slog[i] = __ldcg(a.logits + i);
  __syncthreads();
  for (int t = warp; t < n; t += warps) topk_token(slog, t, a.E, a.k, a.r);
  __threadfence_block();
  __syncthreads();
  const int P = routed_pairs(a.r, n, a.k);  // padding tokens take no pair
  if (P <= 32) {
    if (warp == 0) moe_sort_warp(P, a.k, a.r, a.eb, a.ee, a.r.topk_idx, a.r.topk_w);
  } else {
    moe_sort_block(P, a.E, a.k, a.r, a.eb, a.ee, a.r.topk_idx, a.r.topk_w, sm);
  }
  clear_padding_slots(a.r, P, n * a.k, threadIdx.x, blockDim.x);
  if (threadIdx.x == 0) *a.ticket = 0;
}

// The old fused router's shapes (router variant "old", or where version 2 does not fit).
bool router_route_v1_fuses(int n, int K, int E, int k) {
  return n >= 1 && n <= kRouterMaxTokens && K % 8 == 0 && K <= 16 * 256 && E <= 256 && k <= kMaxTopK && k <= E;
}

bool router_route_fuses(int n, int K, int E, int k) {
  return router_v2_fuses(n, K, E, k) || router_route_v1_fuses(n, K, E, k);
}

void moe_router_route(const bf16_t* w, const float* bias, int E, int K, const float* x, const float* norm_w, float eps,
                      int n, void* xn, bool xn_f16, float* logits, int k, const MoeRouting& r, int* ticket,
                      cudaStream_t s, int eb, int ee) {
  if (ee < 0) ee = E;
  if (eb < 0 || eb >= ee || ee > E) throw Error("moe_router_route: bad expert range");
  const RouterIo io{reinterpret_cast<const uint16_t*>(w), bias, x, norm_w, eps, n, K, E, k, xn, xn_f16, logits, r, eb, ee};
  if (router_v2_route(io, s)) return;
  if (!router_route_v1_fuses(n, K, E, k))
    throw Error("moe_router_route: shape not supported (see router_route_fuses)");
  const int threads = E <= 128 ? 128 : 256;  // moe_sort_block: a thread per expert
  const int blocks = (E + threads / 32 - 1) / (threads / 32);
  const size_t smem = std::max(size_t(n) * K * 2, (5 * size_t(E) + size_t(n) * E) * 4);
  RouterRouteArgs a{io, ticket};
  auto go = [&](auto kernel) {
    allow_dynamic_smem(kernel, smem);
    launch_pdl(kernel, dim3(blocks), dim3(threads), smem, s, a);
  };
  const int kc = (K / 8 + 31) / 32;
  if (kc <= 4) go(router_route_kernel<4>);
  else if (kc <= 8) go(router_route_kernel<8>);
  else if (kc <= 12) go(router_route_kernel<12>);
  else go(router_route_kernel<16>);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

// Token t's residual row, columns [h0, h1) strided over the block: x += sum_j w_j y[slot_j], the
// experts added in order j = 0..k-1 (no atomics: the sum does not depend on which expert finished
// first). Returns this thread's part of the updated row's sum of squares.
__device__ __forceinline__ float combine_slice(const float* __restrict__ y, const MoeRouting& r, int t, int k, int H,
                                               float* __restrict__ xr, int h0, int h1) {
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
  return ss;
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
  float ss = combine_slice(y, r, t, k, H, xr, h0, h1);
  if (!norm_w) return;  // uniform over the cluster
  const float total = cluster_sum<kCombineThreads, kCombineBlocks>(cluster, ss);
  const float inv = 1.0f / sqrtf(total / float(H) + eps);
  for (int h = h0 + threadIdx.x; h < h1; h += blockDim.x) xn[size_t(t) * H + h] = f32_to_bf16_bits(xr[h] * inv * norm_w[h]);
  cluster.sync();  // the others' shared memory stays alive until all have read it
}

// Prefill sizes: a block of kCombineRowThreads per token (the clusters above cost more to schedule
// than their few hundred floats take to move when thousands of tokens come at once). The sum per
// element is the cluster kernel's (experts in order j = 0..k-1); the row's sum of squares meets
// in shared memory in warp order.
constexpr int kCombineRowThreads = 256;

__global__ void __launch_bounds__(kCombineRowThreads)
    moe_combine_rows_kernel(const float* __restrict__ y, MoeRouting r, int k, int H, float* __restrict__ x,
                            const float* __restrict__ norm_w, float eps, uint16_t* __restrict__ xn) {
  pdl_begin();
  const int t = blockIdx.x;
  float* xr = x + size_t(t) * H;
  float ss = combine_slice(y, r, t, k, H, xr, 0, H);
  if (!norm_w) return;
  __shared__ float red[kCombineRowThreads / 32];
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.f;
  for (int i = 0; i < kCombineRowThreads / 32; ++i) total += red[i];
  const float inv = 1.0f / sqrtf(total / float(H) + eps);
  for (int h = threadIdx.x; h < H; h += blockDim.x) xn[size_t(t) * H + h] = f32_to_bf16_bits(xr[h] * inv * norm_w[h]);
}

void moe_combine(const float* y, const MoeRouting& r, int n, int k, int H, float* x, const float* norm_w, float eps,
                 bf16_t* xn, cudaStream_t s, bool invariant) {
  if (n <= 0) return;
  if (k > kMaxTopK) throw Error("moe_combine: top-k too large");
  // Batch-invariant mode keeps one kernel at every size (the norm's sum order is the kernel's).
  if (n > kSkinnyMaxTokens && !invariant) {
    launch_pdl(moe_combine_rows_kernel, dim3(n), dim3(kCombineRowThreads), 0, s, y, r, k, H, x, norm_w, eps, xn);
    GPTOSS_CUDA_LAUNCH_CHECK();
    return;
  }
  if (combine_v2(y, r, n, k, H, x, norm_w, eps, xn, s, invariant)) return;
  launch_pdl(moe_combine_kernel, dim3(n * kCombineBlocks), dim3(kCombineThreads), 0, s, y, r, k, H, x, norm_w, eps,
             xn);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda
