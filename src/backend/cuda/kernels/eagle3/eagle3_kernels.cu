// Small kernels of the Eagle3 draft head on the GPU (eagle3_kernels.h). The heavy parts (the
// GEMVs, RoPE and the K/V store, attention) are the backend's own kernels (kernels.h).
#include "backend/cuda/kernels/eagle3/eagle3_kernels.h"

#include <algorithm>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"

namespace gptoss::cuda {

namespace {

constexpr int kThreads = 256;

// Sums v over the block (kThreads threads); every thread gets the total.
__device__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = threadIdx.x < kThreads / 32 ? red[threadIdx.x] : 0.f;
  if (threadIdx.x < 32) t = warp_sum(t);
  if (threadIdx.x == 0) red[0] = t;
  __syncthreads();
  const float r = red[0];
  __syncthreads();
  return r;
}

__global__ void __launch_bounds__(kThreads) eagle3_input_kernel(const uint16_t* __restrict__ embed,
                                                                const int32_t* __restrict__ tokens,
                                                                const float* __restrict__ h,
                                                                const float* __restrict__ w_in,
                                                                const float* __restrict__ w_hid, int n, int H,
                                                                float eps, int nbr, uint16_t* __restrict__ cat,
                                                                float* __restrict__ resid) {
  pdl_begin();
  __shared__ float red[32];
  const int i = blockIdx.x;
  const uint16_t* e = embed + size_t(tokens[i]) * H;
  const float* hr = h + size_t(i) * H;
  float se = 0.f, sh = 0.f;
  for (int j = threadIdx.x; j < H; j += kThreads) {
    const float a = bf16_bits_to_f32(e[j]), b = hr[j];
    se += a * a;
    sh += b * b;
  }
  se = block_sum(se, red);
  sh = block_sum(sh, red);
  const float inv_e = 1.0f / sqrtf(se / float(H) + eps), inv_h = 1.0f / sqrtf(sh / float(H) + eps);
  uint16_t* out = cat + size_t(i) * 2 * H;
  const bool last = resid && i == n - 1;
  for (int j = threadIdx.x; j < H; j += kThreads) {
    const float b = hr[j], hn = w_hid[j] * (b * inv_h);
    out[j] = f32_to_bf16_bits(w_in[j] * (bf16_bits_to_f32(e[j]) * inv_e));
    out[H + j] = f32_to_bf16_bits(hn);
    if (last) resid[j] = nbr ? hn : b;
  }
}

__global__ void eagle3_silu_mul_kernel(const float* __restrict__ gu, int I, const float* __restrict__ resid, int H,
                                       uint16_t* __restrict__ act, float* __restrict__ out) {
  pdl_begin();
  const int stride = gridDim.x * blockDim.x;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < I; i += stride) {
    const float g = gu[i];
    act[i] = f32_to_bf16_bits(g / (1.0f + expf(-g)) * gu[I + i]);
  }
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < H; j += stride) out[j] = resid[j];
}

__global__ void eagle3_draft_to_target_kernel(const int32_t* __restrict__ draft, const int32_t* __restrict__ d2t,
                                              int V, int32_t* __restrict__ target) {
  pdl_begin();
  // (An argmax over NaN logits finds no index: draft id 0 then, never a read out of bounds.)
  const int d = draft[0];
  if (threadIdx.x == 0) target[0] = d2t[d >= 0 && d < V ? d : 0];
}

__global__ void tap_store_kernel(const float* __restrict__ x, int H, const int32_t* __restrict__ rows, int row0,
                                 int slot, int slots, uint16_t* __restrict__ taps) {
  pdl_begin();
  const int r = blockIdx.x;
  const int t = rows ? rows[r] : row0 + r;
  if (t < 0) return;
  uint16_t* d = taps + (size_t(t) * slots + slot) * H;
  const float* xr = x + size_t(r) * H;
  for (int j = threadIdx.x; j < H; j += blockDim.x) d[j] = f32_to_bf16_bits(xr[j]);
}

}  // namespace

void eagle3_input(const bf16_t* embed, const int32_t* tokens, const float* h, const float* w_in, const float* w_hid,
                  int n, int H, float eps, bool norm_before_residual, bf16_t* cat, float* resid, cudaStream_t s) {
  if (n <= 0) return;
  launch_pdl(eagle3_input_kernel, dim3(n), dim3(kThreads), 0, s, embed, tokens, h, w_in, w_hid, n, H, eps,
             norm_before_residual ? 1 : 0, cat, resid);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

void eagle3_silu_mul(const float* gu, int I, const float* resid, int H, bf16_t* act, float* out, cudaStream_t s) {
  const int blocks = std::min(264, (std::max(I, H) + kThreads - 1) / kThreads);
  launch_pdl(eagle3_silu_mul_kernel, dim3(blocks), dim3(kThreads), 0, s, gu, I, resid, H, act, out);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

void eagle3_draft_to_target(const int32_t* draft, const int32_t* d2t, int V, int32_t* target, cudaStream_t s) {
  launch_pdl(eagle3_draft_to_target_kernel, dim3(1), dim3(32), 0, s, draft, d2t, V, target);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

void tap_store(const float* x, int n, int H, const int32_t* rows, int row0, int slot, int slots, bf16_t* taps,
               cudaStream_t s) {
  if (n <= 0) return;
  launch_pdl(tap_store_kernel, dim3(n), dim3(kThreads), 0, s, x, H, rows, row0, slot, slots, taps);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda
