#pragma once
// Version 2 of the decode-size MoE router and combine (route_decode.cu), behind the entry points
// of kernels.h (moe_router_route, moe_combine in route.cu): each returns false where the chosen
// variant is the old kernel or the shape is not one it takes, and route.cu runs the old kernel.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace gptoss::cuda {

// What a decode router launch reads and writes (both versions: route.cu, route_decode.cu).
struct RouterIo {
  const uint16_t* w;  // [E, K] bf16 router rows
  const float* bias;  // [E] or null
  const float* x;     // [n, K] f32 residual rows
  const float* norm_w;
  float eps;
  int n, K, E, k;
  void* xn;  // [n, K] normalized rows (bf16, or fp16 if xn_f16); null: not wanted
  bool xn_f16;
  float* logits;  // [n, E]
  MoeRouting r;
  int eb, ee;
};

// Router version 2 takes (n, K, E, k) under the current router variant.
bool router_v2_fuses(int n, int K, int E, int k);
bool router_v2_route(const RouterIo& io, cudaStream_t s);
// Combine version 2 (n <= kSkinnyMaxTokens, or any n when invariant: one cluster shape at every
// size then, so a token's sums do not depend on its batch).
bool combine_v2(const float* y, const MoeRouting& r, int n, int k, int H, float* x, const float* norm_w, float eps,
                bf16_t* xn, cudaStream_t s, bool invariant);

}  // namespace gptoss::cuda
