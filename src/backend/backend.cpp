#include "backend/backend.h"

namespace gptoss {

size_t kv_page_bytes(const GptOssConfig& c, KvGroup g, int page_size, DType dtype) {
  int layers = g == kKvSliding ? c.num_sliding_layers() : c.num_full_layers();
  return size_t(layers) * 2 * page_size * c.kv_dim() * dtype_size(dtype);
}

}  // namespace gptoss
