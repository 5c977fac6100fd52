// Embedding lookup and RMSNorm (bf16 rows for the next GEMM).
#include <cooperative_groups.h>

#include <cstdio>
#include <string>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/kv_layout.h"

namespace gptoss::cuda {

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

}  // namespace gptoss::cuda
