#pragma once
// The merge of decode attention's KV splits, shared by the kernels that produce them
// (attention.cu's CUDA-core kernel and its merge launch, attention_decode_mma.cu's tensor-core
// kernel): a split's partial row is (running max m, sum l, then D output floats), in natural-log
// units (p = exp(s - m)); a split that saw no keys has m = -inf, l = 0.
#include "backend/cuda/device_utils.cuh"

namespace gptoss::cuda {

// Merges one (token, query head)'s split partials (split s's row at row(s): running max, sum,
// then D output floats) with the sink and stores the bf16 output row; one warp. Lane s reads
// split s's max and sum, so the weights come from two warp reductions instead of a serial walk;
// the output rows are then summed in split order, skipping splits that saw no keys (weight 0).
// The combine kernel and the cluster merge of the decode kernel both run this code, so they give
// the same bits for the same partials.
template <int D, class RowOf>
__device__ __forceinline__ void merge_splits(RowOf row, int nsplit, float sink, uint16_t* __restrict__ dst,
                                             int lane) {
  constexpr int DPL = D / 32;
  float ms = -INFINITY, ls = 0.f;
  if (lane < nsplit) {
    ms = row(lane)[0];
    ls = row(lane)[1];
  }
  const float M = fmaxf(warp_max(ms), sink);
  const float w = lane < nsplit ? __expf(ms - M) : 0.f;  // empty split: m = -inf, w = 0
  const float denom = __expf(sink - M) + warp_sum(ls * w);
  float acc[DPL];
#pragma unroll
  for (int i = 0; i < DPL; ++i) acc[i] = 0.f;
#pragma unroll 4
  for (int s = 0; s < nsplit; ++s) {
    const float ws = __shfl_sync(0xffffffffu, w, s);
    if (ws == 0.f) continue;  // uniform over the warp
    const float* ps = row(s) + 2 + lane * DPL;
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] += ps[i] * ws;
  }
  const float inv = 1.f / denom;
#pragma unroll
  for (int i = 0; i < DPL; ++i) dst[lane * DPL + i] = f32_to_bf16_bits(acc[i] * inv);
}

}  // namespace gptoss::cuda
