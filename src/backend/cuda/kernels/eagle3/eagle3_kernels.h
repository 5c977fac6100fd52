#pragma once
// The few kernels the Eagle3 draft head (backend/cuda/eagle3_head.cpp) needs beyond kernels.h,
// and the hidden-state tap store the backend runs for it. All pointers are device pointers;
// launches are asynchronous on `s` and graph-capturable.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace gptoss::cuda {

// Row i of the head's input, for n rows: cat[i] = [rmsnorm(embed[tokens[i]]) * w_in ;
// rmsnorm(h[i]) * w_hid] (bf16 [n, 2H]). resid (f32 [H], may be null) gets the last row's
// residual start: h[n-1], or its normalized form when norm_before_residual.
void eagle3_input(const bf16_t* embed, const int32_t* tokens, const float* h, const float* w_in, const float* w_hid,
                  int n, int H, float eps, bool norm_before_residual, bf16_t* cat, float* resid, cudaStream_t s);
// act[i] = silu(gu[i]) * gu[I + i] (bf16 [I]; gu f32 [2I], gate then up) and out = resid (f32 [H]),
// the residual the down projection then adds to.
void eagle3_silu_mul(const float* gu, int I, const float* resid, int H, bf16_t* act, float* out, cudaStream_t s);
// target[0] = d2t[draft[0]]: a draft-vocabulary argmax (of V ids) to its target token id.
void eagle3_draft_to_target(const int32_t* draft, const int32_t* d2t, int V, int32_t* target, cudaStream_t s);
// The residual stream x (f32 [n, H], one row per pass row) as bf16 into slot `slot` of the
// [tokens, slots * H] tap rows: pass row r goes to token rows ? rows[r] : row0 + r.
void tap_store(const float* x, int n, int H, const int32_t* rows, int row0, int slot, int slots, bf16_t* taps,
               cudaStream_t s);

}  // namespace gptoss::cuda
