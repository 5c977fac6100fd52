// f32 rows -> bf16 rows (round to nearest even): the last step of a GEMM staged through f32
// (cublaslt_gemm.cpp, when cuBLASLt has no bf16-output algorithm with an f32 bias); and f32
// values rounded to bf16 ones in place (random weights: checkpoints store norms and biases in bf16).
#include <algorithm>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"

namespace gptoss::cuda {

// Grid: y = row, x over the row's columns, four a thread (no 64-bit division per element).
__global__ void f32_rows_to_bf16_kernel(const float* __restrict__ x, int M, int N, uint16_t* __restrict__ out,
                                        int ldo) {
  pdl_begin();
  const int r = blockIdx.y;
  const float* xr = x + size_t(r) * N;
  uint16_t* orow = out + size_t(r) * ldo;
  // Whole 16-byte loads and 8-byte stores when every row starts aligned (N, ldo multiples of 4).
  const bool vec = (N & 3) == 0 && (ldo & 3) == 0;
  for (int n = (blockIdx.x * blockDim.x + threadIdx.x) * 4; n < N; n += gridDim.x * blockDim.x * 4) {
    if (vec) {
      const float4 v = *reinterpret_cast<const float4*>(xr + n);
      *reinterpret_cast<uint2*>(orow + n) =
          make_uint2(uint32_t(f32_to_bf16_bits(v.x)) | (uint32_t(f32_to_bf16_bits(v.y)) << 16),
                     uint32_t(f32_to_bf16_bits(v.z)) | (uint32_t(f32_to_bf16_bits(v.w)) << 16));
    } else {
      for (int i = n; i < min(N, n + 4); ++i) orow[i] = f32_to_bf16_bits(xr[i]);
    }
  }
}

void f32_rows_to_bf16(const float* x, int M, int N, bf16_t* out, int ldo, cudaStream_t s) {
  if (M <= 0 || N <= 0) return;
  const int bx = std::min((N / 4 + 255) / 256, 8);
  launch_pdl(f32_rows_to_bf16_kernel, dim3(std::max(bx, 1), M), dim3(256), 0, s, x, M, N, out, ldo);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

__global__ void round_f32_to_bf16_values_kernel(float* __restrict__ x, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    x[i] = bf16_bits_to_f32(f32_to_bf16_bits(x[i]));
}

void round_f32_to_bf16_values(float* x, size_t n, cudaStream_t s) {
  if (n == 0) return;
  const int blocks = int(std::min<size_t>((n + 255) / 256, 4096));
  round_f32_to_bf16_values_kernel<<<blocks, 256, 0, s>>>(x, n);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda
