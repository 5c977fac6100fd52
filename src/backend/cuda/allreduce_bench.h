#pragma once
// `gptoss bench-allreduce`: latency of the tensor-parallel all-reduce on this host's GPUs, NCCL
// against the peer-memory kernels (the LL kernel, the earlier staged one-shot kernel, and the LL
// residual kernel on rows of 2880 with the RMSNorm after it, as TP decode runs it), fp32 messages
// from 5.6 KB to 23.6 MB (2048 rows; the LL kernels up to 1 MB, the experimental two-shot kernel
// up to GPTOSS_ALLREDUCE_TWOSHOT_MAX). Each rank runs in
// its own thread; every measurement is a CUDA graph of `iters` back-to-back all-reduces (as a
// decode step replays them), timed with events on rank 0. Prints a markdown table; never fails
// on a number.
namespace gptoss::cuda {

struct AllReduceBenchOptions {
  int tp = 2;
  int iters = 100;  // all-reduces per graph
  int reps = 5;     // graph replays timed (the best one is reported)
  int first_device = 0;
};

int run_allreduce_bench(const AllReduceBenchOptions& opts);

}  // namespace gptoss::cuda
