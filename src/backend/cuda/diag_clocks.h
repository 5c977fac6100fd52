#pragma once
// The stage clocks of diagnostic builds (tools/gpu/diag_binary.sh with a GPTOSS_DIAG_*_CLOCKS
// define): a kernel's thread 0 adds the cycles between its stages into a __device__ array, and
// at exit the host prints one line a kind of launch, the mean cycles a block of each stage:
//   KERNEL clocks (KIND, N blocks), mean cycles a block: STAGE C; STAGE C; ...
#include <cstdio>

namespace gptoss::cuda {

inline void print_stage_clocks(const char* kernel, const char* kind, const char* const* stages, int nstages,
                               const unsigned long long* sums, unsigned long long blocks) {
  if (!blocks) return;
  std::fprintf(stderr, "%s clocks (%s, %llu blocks), mean cycles a block:", kernel, kind, blocks);
  for (int i = 0; i < nstages; ++i) std::fprintf(stderr, " %s %.0f;", stages[i], double(sums[i]) / double(blocks));
  std::fprintf(stderr, "\n");
}

#ifdef __CUDACC__
// A kernel's table of stage sums, [kinds][8] with the block count at [7], read from the device and
// printed a kind a line.
template <int K>
void print_stage_table(const char* kernel, const unsigned long long (&table)[K][8], const char* const (&kinds)[K],
                       const char* const* stages, int nstages) {
  unsigned long long h[K][8];
  if (cudaMemcpyFromSymbol(h, table, sizeof(h)) != cudaSuccess) return;
  for (int k = 0; k < K; ++k) print_stage_clocks(kernel, kinds[k], stages, nstages, h[k], h[k][7]);
}
#endif

}  // namespace gptoss::cuda

// Thread 0 of a block stamps stage i into its local array `clocks`.
#define GPTOSS_STAGE_CLOCK(clocks, i) \
  do { if (threadIdx.x == 0) (clocks)[i] = clock64(); } while (0)
