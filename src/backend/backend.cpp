#include "backend/backend.h"

#include <vector>

namespace gptoss {

size_t kv_page_bytes(const GptOssConfig& c, KvGroup g, int page_size, DType dtype) {
  int layers = g == kKvSliding ? c.num_sliding_layers() : c.num_full_layers();
  return size_t(layers) * 2 * page_size * c.kv_dim() * dtype_size(dtype);
}

void Backend::forward_greedy(const ForwardBatch& batch, int32_t* tokens_out) {
  const int V = config().vocab;
  std::vector<float> logits(batch.logit_rows.size() * size_t(V));
  forward(batch, logits.data());
  for (size_t r = 0; r < batch.logit_rows.size(); ++r) {
    const float* row = logits.data() + r * V;
    int best = 0;
    for (int i = 1; i < V; ++i)
      if (row[i] > row[best]) best = i;
    tokens_out[r] = best;
  }
}

}  // namespace gptoss
