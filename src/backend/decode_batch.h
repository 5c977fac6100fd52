#pragma once
// Several sequences decoding greedily together, each on pages of its own, for tools and tests
// that need no scheduler (`bench`'s tg runs, the pipelined-decode tests). A sequence is prefilled
// alone; then every decode step is one pass with one token of each sequence, as serving runs a
// decode batch. The engine uses kv/ for real page management.
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace gptoss {

class DecodeBatch {
 public:
  // pages[q]: sequence q's page ids (the same in both page groups), enough for all its positions.
  // The backend's KV cache must already hold them (init_kv_cache).
  DecodeBatch(Backend& backend, std::vector<std::vector<int32_t>> pages);
  // One pass over `tokens` of sequence q (appended at its end); its next token is the greedy pick
  // after them.
  void prefill(int q, const std::vector<int32_t>& tokens);
  // `steps` greedy steps of every sequence together, starting from each one's next token; returns
  // the ids picked, [step][sequence]. Pipelined (Backend::launch_greedy): step i + 1 is launched
  // with its tokens taken from step i on the device, before step i's ids are read; else each
  // step's ids are read (forward_greedy) before the next is launched.
  std::vector<std::vector<int32_t>> decode(int steps, bool pipelined);
  // `steps` steps through forward_sample, every row drawn by `how` (no logprobs, no logit changes):
  // the engine's way; at temperature 0 the same ids as decode().
  std::vector<std::vector<int32_t>> decode_sampled(int steps, const RowSampling& how);
  const std::vector<int32_t>& next() const { return next_; }
  int size() const { return int(pages_.size()); }

 private:
  ForwardBatch step_batch() const;  // one token of each sequence, at its current length

  Backend& b_;
  std::vector<std::vector<int32_t>> pages_;
  std::vector<int> len_;
  std::vector<int32_t> next_;
};

}  // namespace gptoss
