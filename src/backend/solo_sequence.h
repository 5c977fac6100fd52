#pragma once
// One sequence through a backend with the simplest page tables (page i holds positions
// i*page_size ..), for tools and tests that need no scheduler: `logits`, `generate`, golden and
// kernel tests. The engine uses kv/ for real page management.
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace gptoss {

class SoloSequence {
 public:
  // Sizes the backend's KV cache for `max_tokens` positions (this drops what it held).
  SoloSequence(Backend& backend, int max_tokens, int page_size = 16, DType kv_dtype = DType::BF16);
  // Appends `tokens` in one forward pass; returns the logits of every new token when
  // `all_logits`, else of the last one ([rows, vocab]).
  std::vector<float> append(const std::vector<int32_t>& tokens, bool all_logits);
  int length() const { return len_; }

 private:
  Backend& b_;
  int max_tokens_, len_ = 0;
  std::vector<int32_t> pages_;
};

}  // namespace gptoss
