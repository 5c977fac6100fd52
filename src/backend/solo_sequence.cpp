#include "backend/solo_sequence.h"

#include <numeric>

#include "common/error.h"

namespace gptoss {

SoloSequence::SoloSequence(Backend& backend, int max_tokens, int page_size, DType kv_dtype)
    : b_(backend), max_tokens_(max_tokens) {
  KvCacheConfig kv;
  kv.page_size = page_size;
  int pages = (max_tokens + page_size - 1) / page_size;
  kv.num_pages[kKvFull] = kv.num_pages[kKvSliding] = pages;
  kv.dtype = kv_dtype;
  b_.init_kv_cache(kv);
  pages_.resize(pages);
  std::iota(pages_.begin(), pages_.end(), 0);
}

std::vector<float> SoloSequence::append(const std::vector<int32_t>& tokens, bool all_logits) {
  const int n = int(tokens.size());
  if (n == 0) return {};
  if (len_ + n > max_tokens_)
    throw Error("sequence of " + std::to_string(len_ + n) + " tokens exceeds the " + std::to_string(max_tokens_) +
                " it was sized for");
  ForwardBatch fb;
  fb.tokens = tokens;
  SeqBatchInfo s;
  s.first_token = 0;
  s.n_tokens = n;
  s.start_pos = len_;
  for (int g = 0; g < 2; ++g) {
    s.pages[g] = pages_.data();
    s.n_pages[g] = int(pages_.size());
  }
  fb.seqs.push_back(s);
  if (all_logits)
    for (int i = 0; i < n; ++i) fb.logit_rows.push_back(i);
  else
    fb.logit_rows.push_back(n - 1);
  std::vector<float> logits(fb.logit_rows.size() * size_t(b_.config().vocab));
  b_.forward(fb, logits.data());
  len_ += n;
  return logits;
}

}  // namespace gptoss
