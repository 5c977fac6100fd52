// Deterministic random fills (--random-weights): counter-based hashes of (seed, index).
#include <cooperative_groups.h>

#include <cstdio>
#include <string>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/kv_layout.h"

namespace gptoss::cuda {

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
