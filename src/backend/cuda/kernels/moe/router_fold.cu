// Host side of the router fold (RouterFold, kernels.h; device side in router_fold.cuh): the
// router's weights transposed at load, so a folding o_proj block finds its rows' weights for
// every expert in one contiguous run (one bulk copy before its wait).
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/kernels.h"

namespace gptoss::cuda {

namespace {
__global__ void transpose_bf16_kernel(const bf16_t* __restrict__ w, int E, int H, bf16_t* __restrict__ w_t) {
  __shared__ bf16_t tile[32][33];
  const int h0 = blockIdx.x * 32, e0 = blockIdx.y * 32, tx = threadIdx.x, ty = threadIdx.y;
  for (int i = ty; i < 32; i += blockDim.y) {
    const int e = e0 + i, h = h0 + tx;
    if (e < E && h < H) tile[i][tx] = w[size_t(e) * H + h];
  }
  __syncthreads();
  for (int i = ty; i < 32; i += blockDim.y) {
    const int h = h0 + i, e = e0 + tx;
    if (e < E && h < H) w_t[size_t(h) * E + e] = tile[tx][i];
  }
}
}  // namespace

void router_fold_transpose(const bf16_t* w, int E, int H, bf16_t* w_t, cudaStream_t s) {
  transpose_bf16_kernel<<<dim3((H + 31) / 32, (E + 31) / 32), dim3(32, 8), 0, s>>>(w, E, H, w_t);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda
