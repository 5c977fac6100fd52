#pragma once
// The unit-walking grouped decode kernel (skinny_units.cu) as skinny_mma.cu's launcher sees it,
// and the GPTOSS_SKINNY_OPT switches both files read.
#include <cuda_runtime.h>

#include "backend/cuda/kernels/linear/skinny_chunk.cuh"

namespace gptoss::cuda::skinny {

// GPTOSS_SKINNY_OPT (bench comparisons; unset = all on): bit 0 the compile-time chunk counts
// (CC), bit 1 the unit-walking grouped kernel (which needs CC), bit 2 CC for the TP=2 slices too
// (K = 2048 in o_proj, 1472 and 1408 in down, which the unit-walking kernel then takes). 0 turns
// all off, 1 keeps CC for gpt-oss's own K only, 3 adds the units kernel there.
bool skinny_cc_enabled();
bool skinny_units_enabled();
bool skinny_tp_cc_enabled();

// Launches a unit-walking kernel for a grouped one-n-tile MXFP4 problem (activations fp16 if
// xf16, else bf16 converted while staged) and returns true, or returns false without launching
// where it does not take the problem. shape 0: the default by grid (skinny_units.cu), restricted
// to the K-split kernel (8 warps over K, the order of sums of skinny_mma_kernel with KS = 8) where
// k_split_only; 1-9 (bench-kernels) force a K-split shape of skinny_units_kernel, 10-15 a
// warp-per-tile shape of skinny_warp_units_kernel, wherever the kernel takes the problem.
bool launch_skinny_units(const SkinnyArgs& a, int tiles, int groups, bool xf16, int shape, bool k_split_only,
                         cudaStream_t s);

}  // namespace gptoss::cuda::skinny
