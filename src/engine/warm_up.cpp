#include "engine/warm_up.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "common/error.h"

namespace gptoss {

std::vector<int> warm_up_batch_sizes(int max_num_seqs, const std::vector<int>& buckets) {
  std::vector<int> sizes;
  int b = 1;
  for (int x : buckets)
    if (x < max_num_seqs) {
      sizes.push_back(x);
      b = x * 2;
    }
  for (; b < max_num_seqs; b *= 2) sizes.push_back(b);
  if (max_num_seqs >= 1) sizes.push_back(max_num_seqs);
  return sizes;
}

WarmUpResult warm_up(Engine& engine, int prompt_len, int new_tokens) {
  const auto t0 = std::chrono::steady_clock::now();
  WarmUpResult res;
  // Room in the context for the prompt and the new tokens (a sequence ends at max_model_len
  // tokens); ids away from the special tokens at the vocabulary's end.
  new_tokens = std::max(1, std::min(new_tokens, engine.max_model_len() - 1));
  prompt_len = std::max(1, std::min(prompt_len, engine.max_model_len() - new_tokens));
  const int vocab_span = std::max(2, std::min(engine.vocab(), 100000) - 1);
  uint64_t salt = 0x9e3779b97f4a7c15ull;
  std::vector<std::pair<int, bool>> runs;  // (batch size, sampled)
  const std::vector<int> buckets = engine.decode_batch_buckets();
  for (int b : warm_up_batch_sizes(engine.config().max_num_seqs, buckets)) {
    const bool sampled = runs.size() % 2 == 1;
    runs.push_back({b, sampled});
    // A backend with decode graphs (buckets), up to kWarmUpBothModesRows: both, since the CUDA
    // backend's greedy passes there have graphs of their own (lm_head through its int8 screen).
    if (!buckets.empty() && b <= kWarmUpBothModesRows) runs.push_back({b, !sampled});
  }
  for (const auto& [b, sampled] : runs) {
    SamplingParams sp;
    sp.max_tokens = new_tokens;
    sp.ignore_eos = true;
    sp.temperature = sampled ? 1.0f : 0.0f;
    sp.logprobs = sampled ? 0 : -1;
    sp.seed = 1;
    // Every prompt in one prefill pass, so the b sequences then decode together.
    const int len = std::max(1, std::min(prompt_len, engine.config().max_num_batched_tokens / b));
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < b; ++i) {
      // Distinct prompts, so the prefix cache serves none of them and every prefill runs.
      std::vector<int32_t> prompt(len);
      for (int32_t& t : prompt) {
        salt = salt * 6364136223846793005ull + 1442695040888963407ull;
        t = int32_t((salt >> 33) % uint64_t(vocab_span));
      }
      streams.push_back(engine.submit(std::move(prompt), sp));
    }
    while (engine.step()) {
    }
    for (auto& s : streams) {
      int got = 0;
      bool finished = false;
      while (auto ev = s->next(std::chrono::milliseconds(0))) {
        got += int(ev->tokens.size());
        if (ev->finished) {
          finished = true;
          if (ev->finish_reason == FinishReason::kError) throw Error("warm-up: a request failed: " + ev->error);
        }
      }
      if (!finished || got != new_tokens)
        throw Error("warm-up: a request ended with " + std::to_string(got) + " of " + std::to_string(new_tokens) +
                    " tokens");
    }
    if (res.batch_sizes.empty() || res.batch_sizes.back() != b) res.batch_sizes.push_back(b);
    res.requests += b;
    res.tokens += int64_t(b) * (len + new_tokens);
  }
  engine.metrics().reset();
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace gptoss
