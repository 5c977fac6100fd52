#pragma once
// Exact greedy decoding at 1-8 rows without reading all of lm_head in bf16 (lm_head_screen.cu):
// an int8 copy of lm_head (half the bytes) gives every row's logit within a proven radius
// (lm_head_screen_math.h); only the rows whose upper bound reaches the best lower bound are
// computed again in bf16, by the arithmetic of the kernel that runs the full lm_head, and the
// argmax over them is argmax_rows's pick over the full logits, bit for bit.
//
// One step is three launches after the final norm: the screen (int8 GEMV, upper bounds, the best
// lower bound a row through an atomic max), the selection (the 32-row tile pairs holding a
// candidate of any row, listed), the recompute (the listed pairs on the bf16 decode copy; the
// argmax as an atomic max of (value, id) keys; its last block writes the ids and resets the
// step's scratch for the next step, so CUDA graphs replay it as they are).
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/kernels.h"

namespace gptoss::cuda {

class LmHeadScreen {
 public:
  static constexpr int kMaxRows = 8;  // one n-tile of the decode kernels

  bool built() const { return N_ > 0; }
  size_t bytes() const;  // device memory held

  // The int8 copy and its row constants from lm_head as stored row-major in bf16 (W.fmt kBF16).
  void build(const WeightMat& row_major_bf16, cudaStream_t s);

  // ids[0..M) = argmax over each row of x . W^T, as argmax_rows over linear(W_dec, x)'s logits
  // would pick it (sampler_rule: as the sampler's greedy rule does, which differs only where the
  // maximum is -inf: id 0). W_dec: lm_head's bf16 decode copy (kFragBF16), the matrix the full path
  // runs; lm_head_screen_takes(W_dec, M, invariant) must hold. The recomputed tile pairs' logits
  // land in logits ([M][ldo]); the other entries are left as they were. (const, but a step uses
  // the screen's device scratch: steps on one screen must be ordered, as on one stream.)
  void argmax(const WeightMat& W_dec, const bf16_t* x, int lda, int M, float* logits, int ldo, int32_t* ids,
              bool invariant, cudaStream_t s, bool sampler_rule = false) const;

  // Tile pairs (32 rows) recomputed and steps run since build (reads the device; not in graphs).
  struct Stats {
    long long pairs = 0, steps = 0;
  };
  Stats stats(cudaStream_t s) const;

  // [kMaxRows][N] f32 on the device: each row's upper bound S_t + r_t from the last step (tests:
  // every full logit must be at or below it).
  const float* upper_bounds() const { return upper_.get<float>(); }

 private:
  int N_ = 0, K_ = 0;
  DeviceBuffer q_;         // int8 codes + 128, in kFragFP8's byte layout (frag_layout.cuh)
  DeviceBuffer rowc_;      // screen::RowConst [N]
  DeviceBuffer upper_;     // [kMaxRows][N] f32: each row's upper bound
  DeviceBuffer list_;      // [N / 32] int: the tile pairs to recompute
  DeviceBuffer state_;     // lower_max [kMaxRows] u32, best [kMaxRows] u64, counters
};

// Whether the screen serves lm_head's decode copy W at M rows: a bf16 decode copy whose full
// launch at M rows runs the 8-warp, two-row-tile skinny kernel (linear_runs_dense_8x2), whose
// rows pair into 32-row tiles, with gpt-oss's hidden size staged in shared memory.
bool lm_head_screen_takes(const WeightMat& W, int M, bool invariant);

// GPTOSS_LM_HEAD_SCREEN=0 turns the screen off (A/B runs; read once), or set_lm_head_screen (tests:
// 0 off, 1 on, -1 back to the environment's choice). A backend builds its screen at load only
// where it is on then.
bool lm_head_screen_enabled();
void set_lm_head_screen(int v);
// The screen kernel's chunks in flight a warp and row tile: 1-4 (GPTOSS_LM_HEAD_SCREEN_PF, default
// 2; bench-kernels sweeps them).
void set_lm_head_screen_pf(int pf);
int lm_head_screen_pf();
// Passes whose ids came through a screen (counted by the backend as it runs them; tests).
void note_lm_head_screen_pass();
long long lm_head_screen_passes();

}  // namespace gptoss::cuda
