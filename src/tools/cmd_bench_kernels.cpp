// `gptoss bench-kernels`: microseconds per launch of each decode-path CUDA kernel at a preset's
// shapes (see backend/cuda/kernel_bench.h). For kernel work; `gptoss bench` measures the model.
#include <cstdio>

#include "tools/command.h"
#include "tools/options.h"
#ifdef GPTOSS_HAVE_CUDA
#include "backend/cuda/kernel_bench.h"
#endif

namespace {

struct Args {
  std::string model = "120b";
  int iters = 200, tokens = 1, tp = 1, tp_rank = 0, sm_limit = 0;
  bool attention_only = false;
};

gptoss::tools::RegisterCommand reg({"bench-kernels", "Time each decode kernel (and prefill attention) at gpt-oss shapes (CUDA)",
                                    [](CLI::App* app) {
  auto a = std::make_shared<Args>();
  app->add_option("--model", a->model, "Shapes of this preset: 120b or 20b")->capture_default_str();
  using gptoss::tools::int_range;
  app->add_option("--iters", a->iters, "Timed launches per kernel")->capture_default_str()->check(int_range(1));
  app->add_option("--tokens", a->tokens,
                  "Batch (tokens): decode sizes up to 64; past 64 the prefill expert GEMMs (v1/v2, v3 on Hopper) are timed too")
      ->capture_default_str()
      ->check(int_range(1, 8192));
  app->add_option("--tp", a->tp, "Time the shapes of one tensor-parallel rank of this many (experts split on the intermediate)")
      ->capture_default_str()
      ->check(int_range(1, 8));
  app->add_option("--tp-rank", a->tp_rank, "The rank whose shapes --tp times")->capture_default_str()->check(int_range(0, 7));
  app->add_option("--sm-limit", a->sm_limit,
                  "Time only the expert rows, on this many SMs, the others held idle (0: all SMs, every row): a "
                  "bigger card's memory bandwidth per SM, e.g. an H200's on an H100 at 92")
      ->capture_default_str()
      ->check(int_range(0, 1024));
  app->add_flag("--attention-only", a->attention_only, "Only the attention rows (decode: three launches vs the fused kernel; prefill: per-token vs flash kernel)");
  return [a]() {
#ifdef GPTOSS_HAVE_CUDA
    gptoss::cuda::KernelBenchOptions o;
    o.model = a->model;
    o.iters = a->iters;
    o.tokens = a->tokens;
    o.attention_only = a->attention_only;
    o.tp = a->tp;
    o.tp_rank = a->tp_rank;
    o.sm_limit = a->sm_limit;
    return gptoss::cuda::run_kernel_bench(o);
#else
    std::fprintf(stderr, "bench-kernels: this build has no CUDA backend\n");
    return 1;
#endif
  };
}});

}  // namespace
