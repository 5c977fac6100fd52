// Diagnostics for bench-kernels: the routed experts' MXFP4 bytes (codes and their scales) read
// with plain 16-byte loads and no math, in the access pattern of each decode kernel and at its
// occupancy: the floors the kernels are held to ("experts gate_up bytes, plain read" rows; modes
// in kernels.h, stream_experts_units). Nothing here runs in the model.
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/linear/skinny_chunk.cuh"

namespace gptoss::cuda {

namespace {

using skinny::ld_stream;

// The plain-read diagnostics' start: after the routing is written, this block's group (grid row),
// or -1 where the routing has fewer groups; the next launch may start either way.
__device__ __forceinline__ int diag_group(const MoeRouting& r) {
  pdl_wait();
  const int gi = blockIdx.y < r.counts[0] ? int(blockIdx.y) : -1;
  pdl_trigger();
  return gi;
}

// Diagnostic (bench-kernels): the same grid reading the same bytes of the routed experts with
// plain 16-byte loads and no math: the memory floor of a grouped MXFP4 launch.
__global__ void stream_experts_kernel(const uint4* __restrict__ w, int T, int C, MoeRouting r, uint32_t* sink) {
  const int gi = diag_group(r);
  if (gi < 0) return;
  const uint4* base = w + ((size_t(r.group_expert[gi]) * T + blockIdx.x) * C) * 32;
  uint32_t acc = 0;
  const int n = C * 32;
#pragma unroll 4
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    uint4 v = __ldg(base + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the loads
}

// Diagnostic (bench-kernels): the same bytes read in the unit-walking kernel's pattern, with no
// math and no dependent chain: a block of 8 warps over four row tiles of one group, warp w
// reading chunks w, w + 8, ... of each tile (512 contiguous bytes a warp, four streams 23 KB apart
// a block). MODE 0: the codes alone; 1: also each chunk's 32-byte scale sector from the separate
// scale array, as the kernels do; 2: a layout with the scales inline, each chunk 544 bytes (its
// 512 code bytes, then its 32 scale bytes) in `w` (a buffer of that size; what packing the scales
// beside their codes would read); 3: inline in aligned groups of four chunks (2048 code bytes, then
// their 128 scale bytes); 4: the separate scale array, 128 bytes a warp every fourth chunk step
// (a quarter of the requests for the same bytes). Against stream_experts_kernel (one tile a
// block, contiguous): how much the access pattern itself costs.
template <int MODE>
__global__ void __launch_bounds__(256) stream_experts_units_kernel(const uint4* __restrict__ w,
                                                                   const uint32_t* __restrict__ sc, int T, int C,
                                                                   MoeRouting r, uint32_t* sink) {
  const int gi = diag_group(r);
  if (gi < 0) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const size_t tc0 = (size_t(r.group_expert[gi]) * T + size_t(blockIdx.x) * 4) * C;
  constexpr int kStride = MODE == 2 ? 34 : 32;  // 16-byte words a chunk
  uint32_t acc = 0;
#pragma unroll 2
  for (int c = warp; c < C; c += 8) {
    uint4 v[4];
    uint32_t s4[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const size_t chunk = tc0 + size_t(t) * C + c;
      if constexpr (MODE == 3) {
        // Groups of four chunks, 128-byte aligned: their 4 x 512 code bytes, then their 4 x 32
        // scale bytes (2176 bytes = 136 words a group).
        const uint4* grp = w + (chunk / 4) * 136;
        v[t] = ld_stream(grp + (chunk % 4) * 32 + lane);
        s4[t] = __ldg(reinterpret_cast<const uint32_t*>(grp + 128) + (chunk % 4) * 8 + lane / 4);
      } else {
        v[t] = ld_stream(w + chunk * kStride + lane);
      }
      if constexpr (MODE == 1) s4[t] = __ldg(sc + chunk * 8 + lane / 4);
      // 4: the scale array read 128 bytes a warp (four chunks' sectors, a word a lane) on every
      // fourth chunk step: a quarter of mode 1's requests for the same bytes (none past the tile).
      if constexpr (MODE == 4) s4[t] = ((c >> 3) & 3) == 0 && c + lane / 8 < C ? __ldg(sc + chunk * 8 + lane) : 0u;
      if constexpr (MODE == 2) s4[t] = __ldg(reinterpret_cast<const uint32_t*>(w + chunk * kStride + 32) + lane / 4);
    }
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      acc ^= v[t].x ^ v[t].y ^ v[t].z ^ v[t].w;
      if constexpr (MODE != 0) acc ^= s4[t];
    }
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the loads
}

// Diagnostic (bench-kernels): the same bytes in the warp-per-tile walk's pattern, with no math:
// a block of 8 warps over 8 row tiles of one group, each warp streaming one whole tile (its C
// chunks in order, 512 code bytes and the chunk's 32-byte scale sector each, 8 chunks in flight),
// so a block reads 8 streams 23 KB apart at once (the default decode kernel from 3 tokens).
// INTERLEAVED: the same reads at the addresses a layout interleaving 8 tiles chunk by chunk
// ([T / 8][C][8][chunk]) would give them, so a block's 8 warps read 4 KB of adjacent memory at a
// time: what the walk's pattern costs against a layout made for it.
template <bool INTERLEAVED>
__global__ void __launch_bounds__(256) stream_experts_walk_kernel(const uint4* __restrict__ w,
                                                                  const uint32_t* __restrict__ sc, int T, int C,
                                                                  MoeRouting r, uint32_t* sink) {
  const int gi = diag_group(r);
  if (gi < 0) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const size_t e = size_t(r.group_expert[gi]), tile = size_t(blockIdx.x) * 8 + warp;
  auto chunk_index = [&](int c) {
    return INTERLEAVED ? ((e * (T / 8) + blockIdx.x) * C + c) * 8 + warp : (e * T + tile) * C + c;
  };
  constexpr int kRing = 8;
  uint32_t acc = 0;
  for (int c0 = 0; c0 < C; c0 += kRing) {
    uint4 v[kRing];
    uint32_t s[kRing];
#pragma unroll
    for (int u = 0; u < kRing; ++u)
      if (c0 + u < C) {
        const size_t ch = chunk_index(c0 + u);
        v[u] = ld_stream(w + ch * 32 + lane);
        s[u] = __ldg(sc + ch * 8 + lane / 4);
      }
#pragma unroll
    for (int u = 0; u < kRing; ++u)
      if (c0 + u < C) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w ^ s[u];
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the loads
}

// Diagnostic (bench-kernels): the walk's pattern over the walk's own grid: two blocks an SM (shared
// memory reserved), each taking a contiguous, equal run of units (a unit: 8 row tiles of one group,
// a whole tile a warp), as skinny_warp_units_kernel deals them. SLIDING false: a warp asks for 8
// chunks, then uses them (mode 5's order: 4 KB of adjacent bytes asked for at once); true: the
// walk's own ring, each slot asked for again as soon as it is used (8 in flight, one request at
// a time). What the walk's order of requests costs the DRAM, apart from its math.
template <bool SLIDING>
__global__ void __launch_bounds__(256) stream_experts_walk_grid_kernel(const uint4* __restrict__ w,
                                                                       const uint32_t* __restrict__ sc, int T, int C,
                                                                       MoeRouting r, uint32_t* sink) {
  pdl_wait();
  const int ng = r.counts[0];
  pdl_trigger();
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int TB = T / 8, units = ng * TB;
  const int u0 = int(int64_t(blockIdx.x) * units / gridDim.x), u1 = int(int64_t(blockIdx.x + 1) * units / gridDim.x);
  constexpr int kRing = 8;
  uint32_t acc = 0;
  for (int u = u0; u < u1; ++u) {
    const int gi = u / TB, tb = u - gi * TB;
    const size_t base = (size_t(r.group_expert[gi]) * T + size_t(tb) * 8 + warp) * C;
    uint4 v[kRing];
    uint32_t s[kRing];
    if constexpr (!SLIDING) {
      for (int c0 = 0; c0 < C; c0 += kRing) {
#pragma unroll
        for (int k = 0; k < kRing; ++k)
          if (c0 + k < C) {
            v[k] = ld_stream(w + (base + c0 + k) * 32 + lane);
            s[k] = __ldg(sc + (base + c0 + k) * 8 + lane / 4);
          }
#pragma unroll
        for (int k = 0; k < kRing; ++k)
          if (c0 + k < C) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w ^ s[k];
      }
    } else {
#pragma unroll
      for (int k = 0; k < kRing; ++k)
        if (k < C) {
          v[k] = ld_stream(w + (base + k) * 32 + lane);
          s[k] = __ldg(sc + (base + k) * 8 + lane / 4);
        }
      for (int c0 = 0; c0 < C; c0 += kRing) {
#pragma unroll
        for (int k = 0; k < kRing; ++k) {
          if (c0 + k < C) {
            acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w ^ s[k];
            // (acc feeds the next address, so the slot's new request waits for the use of its
            // last; the other choice, never taken, stays inside the tile)
            const size_t ch = acc == 0x9e3779b9u ? base : base + c0 + k + kRing;
            if (c0 + k + kRing < C) {
              v[k] = ld_stream(w + ch * 32 + lane);
              s[k] = __ldg(sc + ch * 8 + lane / 4);
            }
          }
        }
      }
    }
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the loads
}

}  // namespace

void stream_experts_units(const WeightMat& W, int pairs, int E, const MoeRouting& r, int mode, uint32_t* sink,
                          cudaStream_t s, const void* inline_buf) {
  const bool inl = mode == 2 || mode == 3;  // the codes (and scales) come from inline_buf
  if (mode == 9 || mode == 10) {
    if (W.N / 16 % 8 != 0) return;
    auto k = mode == 10 ? stream_experts_walk_grid_kernel<true> : stream_experts_walk_grid_kernel<false>;
    const size_t smem = 100 * 1024;  // two blocks an SM, as the walk runs
    allow_dynamic_smem(k, smem);
    launch_pdl(k, dim3(2 * sm_count()), dim3(256), smem, s, static_cast<const uint4*>(W.w),
               reinterpret_cast<const uint32_t*>(W.scales), W.N / 16, W.K / 64, r, sink);
    GPTOSS_CUDA_LAUNCH_CHECK();
    return;
  }
  if (mode >= 5 && mode <= 8) {
    // 5: the warp walk's pattern; 6: the same at interleaved addresses; 7 / 8: 5 with shared
    // memory reserved so that only 2 blocks (16 warps: the walk's occupancy) / 1 fit an SM.
    if (W.N / 16 % 8 != 0) return;
    dim3 grid(W.N / 16 / 8, moe_max_groups(pairs, E));
    auto k = mode == 6 ? stream_experts_walk_kernel<true> : stream_experts_walk_kernel<false>;
    const size_t smem = mode == 7 ? 100 * 1024 : mode == 8 ? 160 * 1024 : 0;
    if (smem) allow_dynamic_smem(k, smem);
    launch_pdl(k, grid, dim3(256), smem, s, static_cast<const uint4*>(W.w), reinterpret_cast<const uint32_t*>(W.scales),
               W.N / 16, W.K / 64, r, sink);
    GPTOSS_CUDA_LAUNCH_CHECK();
    return;
  }
  if (W.N / 16 % 4 != 0 || mode < 0 || mode > 4 || (inl && !inline_buf)) return;
  constexpr decltype(&stream_experts_units_kernel<0>) kernels[] = {
      stream_experts_units_kernel<0>, stream_experts_units_kernel<1>, stream_experts_units_kernel<2>,
      stream_experts_units_kernel<3>, stream_experts_units_kernel<4>};
  dim3 grid(W.N / 16 / 4, moe_max_groups(pairs, E));
  const auto* w = static_cast<const uint4*>(inl ? inline_buf : W.w);
  const auto* sc = reinterpret_cast<const uint32_t*>(W.scales);
  launch_pdl(kernels[mode], grid, dim3(256), 0, s, w, sc, W.N / 16, W.K / 64, r, sink);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

void stream_experts(const WeightMat& W, int pairs, int E, const MoeRouting& r, uint32_t* sink, cudaStream_t s) {
  dim3 grid(W.N / 16, moe_max_groups(pairs, E));
  launch_pdl(stream_experts_kernel, grid, dim3(128), 0, s, static_cast<const uint4*>(W.w), W.N / 16, W.K / 64, r, sink);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda
