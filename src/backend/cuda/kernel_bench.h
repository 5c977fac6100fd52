#pragma once
// Per-kernel timing of the decode-path kernels at gpt-oss shapes (`gptoss bench-kernels`): each
// kernel launched back to back on one stream as in a decode step, weights rotated over copies
// that together exceed the L2 cache so every launch reads them from DRAM. Prints a markdown
// table (microseconds per launch, GB/s of weights read). A tool for kernel work: it prints and
// never fails on a number.
#include <string>

namespace gptoss::cuda {

struct KernelBenchOptions {
  std::string model = "120b";  // shapes of this preset
  int iters = 200;             // timed launches per kernel
  int tokens = 1;              // decode batch
};

int run_kernel_bench(const KernelBenchOptions& opts);

}  // namespace gptoss::cuda
