#include "backend/decode_batch.h"

#include <string>

#include "common/error.h"

namespace gptoss {

DecodeBatch::DecodeBatch(Backend& backend, std::vector<std::vector<int32_t>> pages)
    : b_(backend), pages_(std::move(pages)), len_(pages_.size(), 0), next_(pages_.size(), 0) {}

void DecodeBatch::prefill(int q, const std::vector<int32_t>& tokens) {
  if (q < 0 || q >= size() || tokens.empty()) throw Error("DecodeBatch::prefill: no sequence " + std::to_string(q) + " or no tokens");
  ForwardBatch fb;
  fb.tokens = tokens;
  SeqBatchInfo s;
  s.n_tokens = int(tokens.size());
  s.start_pos = len_[q];
  for (int g = 0; g < 2; ++g) {
    s.pages[g] = pages_[q].data();
    s.n_pages[g] = int(pages_[q].size());
  }
  fb.seqs.push_back(s);
  fb.logit_rows.push_back(s.n_tokens - 1);
  b_.forward_greedy(fb, &next_[q]);
  len_[q] += s.n_tokens;
}

ForwardBatch DecodeBatch::step_batch() const {
  ForwardBatch fb;
  for (int q = 0; q < size(); ++q) {
    SeqBatchInfo s;
    s.first_token = q;
    s.n_tokens = 1;
    s.start_pos = len_[q];
    for (int g = 0; g < 2; ++g) {
      s.pages[g] = pages_[q].data();
      s.n_pages[g] = int(pages_[q].size());
    }
    fb.tokens.push_back(next_[q]);
    fb.seqs.push_back(s);
    fb.logit_rows.push_back(q);
  }
  return fb;
}

std::vector<std::vector<int32_t>> DecodeBatch::decode(int steps, bool pipelined) {
  std::vector<std::vector<int32_t>> ids(steps, std::vector<int32_t>(size()));
  for (int i = 0; i < steps; ++i) {
    ForwardBatch fb = step_batch();
    if (!pipelined) {
      b_.forward_greedy(fb, ids[i].data());
      next_ = ids[i];
    } else {
      b_.launch_greedy(fb, i > 0);  // step 0 from next_, the others from the step before, on the device
      if (i > 0) b_.finish_greedy(ids[i - 1].data());
    }
    for (int& l : len_) ++l;
  }
  if (pipelined && steps > 0) {
    b_.finish_greedy(ids[steps - 1].data());
    next_ = ids[steps - 1];
  }
  return ids;
}

std::vector<std::vector<int32_t>> DecodeBatch::decode_sampled(int steps, const RowSampling& how) {
  std::vector<std::vector<int32_t>> ids(steps, std::vector<int32_t>(size()));
  const std::vector<RowSampling> rows(size(), how);
  for (int i = 0; i < steps; ++i) {
    b_.forward_sample(step_batch(), rows.data(), ids[i].data());
    next_ = ids[i];
    for (int& l : len_) ++l;
  }
  return ids;
}

}  // namespace gptoss
