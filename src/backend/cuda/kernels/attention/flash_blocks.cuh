#pragma once
// How a pass's tokens split between the flash kernel (flash_attention.cu) and the per-token kernel
// (attention.cu) when one pass mixes prefill chunks with decode tokens: the flash kernel works in
// blocks of tq consecutive tokens, and a block is worth a flash CTA when its tokens form at most
// kFlashMaxRuns runs of one sequence (a CTA walks one run after another, each over its own KV
// range, so a block of 16 decode tokens of 16 sequences would walk 16 KV ranges serially). Both
// kernels (and the split merge) evaluate the same rule on the same metadata, so every token is
// taken by exactly one of them.
#include <cstdint>

namespace gptoss::cuda {

constexpr int kFlashMaxRuns = 2;

__device__ __forceinline__ bool flash_takes_block(const int32_t* pt_off, int n, int t0, int tq) {
  const int end = min(n, t0 + tq);
  int runs = 1;
  for (int t = t0 + 1; t < end; ++t) runs += pt_off[t] != pt_off[t - 1];
  return runs <= kFlashMaxRuns;
}

}  // namespace gptoss::cuda
