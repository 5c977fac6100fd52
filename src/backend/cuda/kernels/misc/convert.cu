// f32 rows -> bf16 rows (round to nearest even): the last step of a GEMM staged through f32
// (cublaslt_gemm.cpp, when cuBLASLt has no bf16-output algorithm with an f32 bias).
#include <algorithm>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"

namespace gptoss::cuda {

__global__ void f32_rows_to_bf16_kernel(const float* __restrict__ x, int M, int N, uint16_t* __restrict__ out,
                                        int ldo) {
  pdl_begin();
  const size_t total = size_t(M) * N;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    const size_t r = i / N, n = i % N;
    out[r * ldo + n] = f32_to_bf16_bits(x[i]);
  }
}

void f32_rows_to_bf16(const float* x, int M, int N, bf16_t* out, int ldo, cudaStream_t s) {
  if (M <= 0 || N <= 0) return;
  const size_t total = size_t(M) * N;
  const int blocks = int(std::min<size_t>((total + 255) / 256, 4096));
  launch_pdl(f32_rows_to_bf16_kernel, dim3(blocks), dim3(256), 0, s, x, M, N, out, ldo);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda
