// Small kernels of the forward pass: embedding, RMSNorm, RoPE + KV store, MoE routing, argmax,
// random fills; plus the host helpers of cuda_common.h.
#include <cooperative_groups.h>

#include <cstdio>
#include <string>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"

namespace gptoss::cuda {

void throw_cuda_error(cudaError_t e, const char* what, const char* file, int line) {
  throw Error(std::string("CUDA error ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ") in " + what +
              " at " + file + ":" + std::to_string(line));
}

void DeviceBuffer::alloc(size_t bytes) {
  reset();
  if (bytes == 0) return;
  cudaError_t e = cudaMalloc(&p_, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    p_ = nullptr;
    throw Error("cudaMalloc of " + std::to_string(bytes) + " bytes failed: " + cudaGetErrorString(e));
  }
  n_ = bytes;
}

void DeviceBuffer::reset() {
  if (p_) cudaFree(p_);
  p_ = nullptr;
  n_ = 0;
}

bool cuda_device_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

// ---------------------------------------------------------------------------------------------

__global__ void embed_kernel(const uint16_t* __restrict__ table, const int32_t* __restrict__ tokens, int H,
                             float* __restrict__ x) {
  pdl_begin();
  int t = blockIdx.x;
  const uint16_t* row = table + size_t(tokens[t]) * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) x[size_t(t) * H + i] = bf16_bits_to_f32(row[i]);
}

void embed(const bf16_t* table, const int32_t* tokens, int n, int H, float* x, cudaStream_t s) {
  if (n <= 0) return;
  launch_pdl(embed_kernel, dim3(n), dim3(256), 0, s, table, tokens, H, x);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

// One block of 1024 threads per row, x read once with 16-byte loads and kept in registers
// (H <= 4 * 4 * 1024): a decode step runs this on one row, where latency is all that counts.
constexpr int kNormThreads = 1024, kNormVec = 4;
__global__ void __launch_bounds__(1024) rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w, int H,
                                                       float eps, const int32_t* __restrict__ rows,
                                                       uint16_t* __restrict__ y) {
  pdl_begin();
  int r = blockIdx.x;
  int src = rows ? rows[r] : r;
  const float4* xr = reinterpret_cast<const float4*>(x + size_t(src) * H);
  const int n4 = H / 4;
  float4 v[kNormVec];
  float ss = 0.f;
#pragma unroll
  for (int u = 0; u < kNormVec; ++u) {
    int i = threadIdx.x + u * kNormThreads;
    v[u] = i < n4 ? xr[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
  }
  __shared__ float red[32];
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float t = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.f;
    t = warp_sum(t);
    if (threadIdx.x == 0) red[0] = t;
  }
  __syncthreads();
  const float inv = 1.0f / sqrtf(red[0] / float(H) + eps);
  const float4* w4 = reinterpret_cast<const float4*>(w);
  uint2* yr = reinterpret_cast<uint2*>(y + size_t(r) * H);
#pragma unroll
  for (int u = 0; u < kNormVec; ++u) {
    int i = threadIdx.x + u * kNormThreads;
    if (i < n4) {
      float4 ww = w4[i];
      uint2 o;
      o.x = uint32_t(f32_to_bf16_bits(v[u].x * inv * ww.x)) | (uint32_t(f32_to_bf16_bits(v[u].y * inv * ww.y)) << 16);
      o.y = uint32_t(f32_to_bf16_bits(v[u].z * inv * ww.z)) | (uint32_t(f32_to_bf16_bits(v[u].w * inv * ww.w)) << 16);
      yr[i] = o;
    }
  }
}

void rmsnorm(const float* x, const float* w, int n, int H, float eps, const int32_t* rows, bf16_t* y,
             cudaStream_t s) {
  if (n <= 0) return;
  if (H % 4 != 0 || H > 4 * kNormVec * kNormThreads) throw Error("rmsnorm: H must be a multiple of 4, <= 16384");
  launch_pdl(rmsnorm_kernel, dim3(n), dim3(kNormThreads), 0, s, x, w, H, eps, rows, y);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ size_t kv_offset(int page, int kv, int slot, int h, int d, int ps, int Hkv, int D) {
  return ((size_t(page) * 2 + kv) * ps + slot) * size_t(Hkv * D) + size_t(h) * D + d;
}

__global__ void rope_kv_kernel(uint16_t* __restrict__ qkv, int Hq, int Hkv, int D,
                               const float* __restrict__ inv_freq, float scaling, TokenMeta tm, KvLayer kv) {
  pdl_begin();
  int t = blockIdx.x;
  int pos = tm.pos[t];
  int half = D / 2;
  int row_len = (Hq + 2 * Hkv) * D;
  uint16_t* row = qkv + size_t(t) * row_len;
  int page = tm.pt[tm.pt_off[t] + pos / kv.page_size];
  int slot = pos % kv.page_size;
  // cos/sin once per frequency (not per head): precise sincosf is the costly part.
  __shared__ float cs[64], sn_s[64];
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    float ang = float(pos) * inv_freq[j];
    float sv, cv;
    sincosf(ang, &sv, &cv);
    cs[j] = cv * scaling;
    sn_s[j] = sv * scaling;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < (Hq + Hkv) * half; i += blockDim.x) {
    int h = i / half, j = i % half;
    float c = cs[j], sn = sn_s[j];
    uint16_t* hp = row + size_t(h) * D;
    float x1 = bf16_bits_to_f32(hp[j]), x2 = bf16_bits_to_f32(hp[j + half]);
    float o1 = x1 * c - x2 * sn, o2 = x2 * c + x1 * sn;
    if (h < Hq) {
      hp[j] = f32_to_bf16_bits(o1);
      hp[j + half] = f32_to_bf16_bits(o2);
    } else {
      int kh = h - Hq;
      // Round through bf16 first so the cache holds what a bf16 k would be.
      float r1 = bf16_bits_to_f32(f32_to_bf16_bits(o1)), r2 = bf16_bits_to_f32(f32_to_bf16_bits(o2));
      size_t o = kv_offset(page, 0, slot, kh, j, kv.page_size, Hkv, D);
      if (kv.fp8) {
        uint8_t* b = static_cast<uint8_t*>(kv.base);
        b[o] = f32_to_fp8_bits(r1);
        b[o + half] = f32_to_fp8_bits(r2);
      } else {
        uint16_t* b = static_cast<uint16_t*>(kv.base);
        b[o] = f32_to_bf16_bits(r1);
        b[o + half] = f32_to_bf16_bits(r2);
      }
    }
  }
  const uint16_t* v = row + size_t(Hq + Hkv) * D;
  for (int i = threadIdx.x; i < Hkv * D; i += blockDim.x) {
    size_t o = kv_offset(page, 1, slot, i / D, i % D, kv.page_size, Hkv, D);
    if (kv.fp8)
      static_cast<uint8_t*>(kv.base)[o] = f32_to_fp8_bits(bf16_bits_to_f32(v[i]));
    else
      static_cast<uint16_t*>(kv.base)[o] = v[i];
  }
}

void rope_kv_store(bf16_t* qkv, int n, int Hq, int Hkv, int D, const float* inv_freq, float attn_scaling,
                   const TokenMeta& tm, const KvLayer& kv, cudaStream_t s) {
  if (n <= 0) return;
  if (D > 128) throw Error("rope: head_dim must be <= 128");
  launch_pdl(rope_kv_kernel, dim3(n), dim3(512), 0, s, qkv, Hq, Hkv, D, inv_freq, attn_scaling, tm, kv);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------------------------
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

__device__ void moe_sort_block(int P, int E, int k, const MoeRouting& r) {
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
  int c = e < E ? cnt[e] : 0;
  int nt = (c + kGemmBM - 1) / kGemmBM;
  if (e < E) { s_off[e] = c; s_grp[e] = c > 0; s_tile[e] = nt; }
  __syncthreads();
  for (int d = 1; d < E; d *= 2) {  // Hillis-Steele inclusive scans
    int a0 = 0, a1 = 0, a2 = 0;
    if (e < E && e >= d) { a0 = s_off[e - d]; a1 = s_grp[e - d]; a2 = s_tile[e - d]; }
    __syncthreads();
    if (e < E && e >= d) { s_off[e] += a0; s_grp[e] += a1; s_tile[e] += a2; }
    __syncthreads();
  }
  if (e < E) {
    int off = s_off[e] - c, g = s_grp[e] - (c > 0), t0 = s_tile[e] - nt;
    cursor[e] = off;
    if (c > 0) {
      r.group_expert[g] = e;
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

__global__ void moe_sort_kernel(int P, int E, int k, MoeRouting r) {
  pdl_begin();
  moe_sort_block(P, E, k, r);
}

// Decode-sized batches: top-k and the sort in one launch (one block), a launch less per layer.
__global__ void moe_route_small_kernel(const float* __restrict__ logits, int n, int E, int k, MoeRouting r) {
  pdl_begin();
  for (int t = threadIdx.x / 32; t < n; t += blockDim.x / 32) topk_token(logits, t, E, k, r);
  __threadfence_block();
  __syncthreads();
  moe_sort_block(n * k, E, k, r);
}

void moe_route(const float* logits, int n, int E, int k, const MoeRouting& r, cudaStream_t s) {
  if (n <= 0) return;
  if (E > 32 * kMaxExpertsPerLane || k > kMaxTopK || k > E) throw Error("moe_route: unsupported experts/top-k");
  if (n <= 64) {
    launch_pdl(moe_route_small_kernel, dim3(1), dim3(1024), 5 * E * sizeof(int32_t), s, logits, n, E, k, r);
    GPTOSS_CUDA_LAUNCH_CHECK();
    return;
  }
  launch_pdl(topk_kernel, dim3((n + 7) / 8), dim3(256), 0, s, logits, n, E, k, r);
  GPTOSS_CUDA_LAUNCH_CHECK();
  launch_pdl(moe_sort_kernel, dim3(1), dim3(1024), 5 * E * sizeof(int32_t), s, n * k, E, k, r);
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

// ---------------------------------------------------------------------------------------------

// Row argmax: a cluster of kArgmaxBlocks blocks per row (one SM alone reads a 201088-entry row
// at a fraction of the bandwidth), 16-byte loads; the blocks' winners meet through distributed
// shared memory in the cluster's first block. Ties go to the lowest index.
constexpr int kArgmaxBlocks = 8, kArgmaxThreads = 512;

__device__ __forceinline__ void argmax_merge(float& best, int& bi, float v, int i) {
  if (v > best || (v == best && i < bi)) { best = v; bi = i; }
}

__global__ void __cluster_dims__(kArgmaxBlocks, 1, 1) __launch_bounds__(kArgmaxThreads)
    argmax_kernel(const float* __restrict__ logits, int V, int32_t* __restrict__ out) {
  pdl_begin();
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank());
  const int row_i = blockIdx.x / kArgmaxBlocks;
  const float* row = logits + size_t(row_i) * V;
  // This block's slice, in whole float4s (V % 4 leftovers go to the last block).
  const int n4 = V / 4, per4 = (n4 + kArgmaxBlocks - 1) / kArgmaxBlocks;
  const int b4 = rank * per4, e4 = min(n4, b4 + per4);
  float best = -INFINITY;
  int bi = 0x7fffffff;
  const bool aligned = (reinterpret_cast<uintptr_t>(row) & 15) == 0;
  if (aligned) {
    const float4* r4 = reinterpret_cast<const float4*>(row);
    for (int i = b4 + int(threadIdx.x); i < e4; i += kArgmaxThreads) {
      float4 v = r4[i];
      argmax_merge(best, bi, v.x, 4 * i);
      argmax_merge(best, bi, v.y, 4 * i + 1);
      argmax_merge(best, bi, v.z, 4 * i + 2);
      argmax_merge(best, bi, v.w, 4 * i + 3);
    }
  } else {
    for (int i = 4 * b4 + int(threadIdx.x); i < 4 * e4; i += kArgmaxThreads) argmax_merge(best, bi, row[i], i);
  }
  if (rank == kArgmaxBlocks - 1)
    for (int i = 4 * n4 + int(threadIdx.x); i < V; i += kArgmaxThreads) argmax_merge(best, bi, row[i], i);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float ob = __shfl_xor_sync(0xffffffffu, best, o);
    int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    argmax_merge(best, bi, ob, oi);
  }
  __shared__ float sv[kArgmaxThreads / 32];
  __shared__ int si[kArgmaxThreads / 32];
  const int w = threadIdx.x / 32;
  if ((threadIdx.x & 31) == 0) { sv[w] = best; si[w] = bi; }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < kArgmaxThreads / 32; ++i) argmax_merge(best, bi, sv[i], si[i]);
    sv[0] = best;
    si[0] = bi;
  }
  cluster.sync();  // every block's winner is in its sv[0] / si[0]
  if (rank == 0 && threadIdx.x == 0) {
    for (int r = 1; r < kArgmaxBlocks; ++r)
      argmax_merge(best, bi, *cluster.map_shared_rank(&sv[0], r), *cluster.map_shared_rank(&si[0], r));
    out[row_i] = bi == 0x7fffffff ? 0 : bi;
  }
  cluster.sync();  // the other blocks' shared memory stays alive until rank 0 has read it
}

void argmax_rows(const float* logits, int n, int V, int32_t* out, cudaStream_t s) {
  if (n <= 0) return;
  launch_pdl(argmax_kernel, dim3(n * kArgmaxBlocks), dim3(kArgmaxThreads), 0, s, logits, V, out);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_bf16_kernel(uint16_t* p, size_t n, uint64_t seed, float mean, float amp) {
  pdl_begin();
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t h = splitmix64(seed * 0x100000001b3ull + i);
    float u = float(h >> 40) * (1.0f / 16777216.0f) * 2.f - 1.f;
    p[i] = f32_to_bf16_bits(mean + amp * u);
  }
}

__global__ void fill_u8_kernel(uint8_t* p, size_t n, uint64_t seed, int lo, int span) {
  pdl_begin();
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t h = splitmix64(seed * 0x100000001b3ull + i);
    p[i] = uint8_t(lo + int((h >> 32) % uint64_t(span)));
  }
}

void fill_random_bf16(bf16_t* p, size_t n, uint64_t seed, float mean, float std, cudaStream_t s) {
  if (n == 0) return;
  launch_pdl(fill_bf16_kernel, dim3(1024), dim3(256), 0, s, p, n, seed, mean, std * 1.7320508f);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

__global__ void fill_f32_kernel(float* p, size_t n, uint64_t seed, float mean, float amp) {
  pdl_begin();
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t h = splitmix64(seed * 0x100000001b3ull + i);
    float u = float(h >> 40) * (1.0f / 16777216.0f) * 2.f - 1.f;
    p[i] = mean + amp * u;
  }
}

void fill_random_f32(float* p, size_t n, uint64_t seed, float mean, float std, cudaStream_t s) {
  if (n == 0) return;
  launch_pdl(fill_f32_kernel, dim3(256), dim3(256), 0, s, p, n, seed, mean, std * 1.7320508f);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

void fill_random_u8(uint8_t* p, size_t n, uint64_t seed, int lo, int hi, cudaStream_t s) {
  if (n == 0) return;
  launch_pdl(fill_u8_kernel, dim3(1024), dim3(256), 0, s, p, n, seed, lo, hi - lo + 1);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda
