// `gptoss bench-allreduce --gpus N`: NCCL vs the peer-memory all-reduce kernels on this host's
// GPUs (see backend/cuda/allreduce_bench.h). Needs libnccl.so.2 on LD_LIBRARY_PATH.
#include <cstdio>

#include "tools/command.h"
#include "tools/options.h"
#ifdef GPTOSS_HAVE_CUDA
#include "backend/cuda/allreduce_bench.h"
#endif

namespace {

struct Args {
  int tp = 2, iters = 100, reps = 5, first_device = 0;
};

gptoss::tools::RegisterCommand reg({"bench-allreduce", "Time the tensor-parallel all-reduce, NCCL vs the peer-memory kernels (CUDA)",
                                    [](CLI::App* app) {
  auto a = std::make_shared<Args>();
  using gptoss::tools::int_range;
  app->add_option("--gpus", a->tp, "GPUs in the group (one rank each)")->capture_default_str()->check(int_range(2, 8));
  app->add_option("--calls", a->iters, "All-reduces per captured graph")->capture_default_str()->check(int_range(1));
  app->add_option("--reps", a->reps, "Graph replays timed (best reported)")->capture_default_str()->check(int_range(1));
  app->add_option("--first-device", a->first_device, "First GPU of the group")->capture_default_str()->check(int_range(0));
  return [a]() {
#ifdef GPTOSS_HAVE_CUDA
    gptoss::cuda::AllReduceBenchOptions o;
    o.tp = a->tp;
    o.iters = a->iters;
    o.reps = a->reps;
    o.first_device = a->first_device;
    return gptoss::cuda::run_allreduce_bench(o);
#else
    std::fprintf(stderr, "bench-allreduce: this build has no CUDA backend\n");
    return 1;
#endif
  };
}});

}  // namespace
