#include "backend/cuda/tp_slices.h"

#include <algorithm>

#include "backend/cuda/cuda_common.h"

namespace gptoss::cuda {

void copy_mid_slice(void* dst, const void* src, const MidSlice& s, cudaStream_t stream) {
  if (s.bytes() == 0) return;
  const size_t width = s.count * s.inner_bytes, pitch = s.mid * s.inner_bytes;
  GPTOSS_CUDA_CHECK(cudaMemcpy2DAsync(dst, width, static_cast<const char*>(src) + s.begin * s.inner_bytes, pitch,
                                      width, s.outer, cudaMemcpyDefault, stream));
}

GptOssConfig tp_local_config(const GptOssConfig& full, const TpShard& shard) {
  GptOssConfig c = full;
  c.num_heads = shard.q_heads(full).size();
  c.num_kv_heads = shard.kv_heads(full).size();
  c.intermediate = shard.intermediate(full).size();
  return c;
}

int tp_max_vocab_slice(const GptOssConfig& full, const TpShard& shard) {
  int m = 0;
  for (int r = 0; r < shard.world; ++r) m = std::max(m, TpShard{r, shard.world, shard.experts}.vocab(full).size());
  return m;
}

void gather_vocab_logits(Communicator& comm, const GptOssConfig& full, const TpShard& shard, float* gather, int ld,
                         int n_rows, float* logits, cudaStream_t stream) {
  const size_t part = size_t(n_rows) * ld;
  comm.all_gather(gather + shard.rank * part, gather, part * sizeof(float), stream);
  for (int r = 0; r < shard.world; ++r) {
    const IndexRange v = TpShard{r, shard.world, shard.experts}.vocab(full);
    if (v.size() == 0) continue;
    GPTOSS_CUDA_CHECK(cudaMemcpy2DAsync(logits + v.begin, size_t(full.vocab) * 4, gather + r * part, size_t(ld) * 4,
                                        size_t(v.size()) * 4, n_rows, cudaMemcpyDeviceToDevice, stream));
  }
}

}  // namespace gptoss::cuda
