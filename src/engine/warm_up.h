#pragma once
// Start-up warm-up: a few small batches through the engine before the server listens, so the
// one-time costs a GPU backend has at a shape's first pass (a CUDA graph captured and
// instantiated per decode batch bucket, kernels' modules loaded on first launch, host-side plans
// memoized by size) are paid here and not by the first users. vLLM captures its decode graphs
// at start-up and llama.cpp's server runs an empty pass for the same reason. Measured on one
// H200 (seventeenth session, 20b, 32 streams): the first bench-serve run after start-up was
// 5-10% slower than the next one on the same server.
#include <cstdint>
#include <vector>

#include "engine/engine.h"

namespace gptoss {

struct WarmUpResult {
  std::vector<int> batch_sizes;  // the decode batch sizes run, in order (once each)
  int requests = 0;
  int64_t tokens = 0;            // prompt + generated tokens of the warm-up requests
  double seconds = 0;
};

// The decode batch sizes a warm-up runs for max_num_seqs: the backend's decode buckets below it
// (Backend::decode_batch_buckets; the CUDA backend graphs a pass padded to its bucket), then
// doublings of the largest (or powers of two, with no buckets) below it, and max_num_seqs itself.
std::vector<int> warm_up_batch_sizes(int max_num_seqs, const std::vector<int>& buckets = {});

// Batch sizes up to which the warm-up runs both a greedy batch and a sampled one, on a backend
// with decode batch buckets (graphs).
constexpr int kWarmUpBothModesRows = 8;

// Runs, for each of warm_up_batch_sizes(max_num_seqs, the backend's buckets), that many requests at once (distinct
// prompts of prompt_len tokens, a few greedy decode steps; every other batch sampled with
// logprobs so the sampling kernels load too; with buckets, sizes up to kWarmUpBothModesRows both
// ways), on the caller's thread: call it before Engine::start(). The engine's metrics are reset
// afterwards (the warm-up is not traffic). Throws gptoss::Error if a warm-up request does not
// finish with all its tokens.
WarmUpResult warm_up(Engine& engine, int prompt_len = 32, int new_tokens = 4);

}  // namespace gptoss
