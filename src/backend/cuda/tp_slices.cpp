#include "backend/cuda/tp_slices.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_common.h"

namespace gptoss::cuda {

void copy_mid_slice(void* dst, const void* src, const MidSlice& s, cudaStream_t stream) {
  if (s.bytes() == 0) return;
  const size_t width = s.count * s.inner_bytes, pitch = s.mid * s.inner_bytes;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, src) != cudaSuccess) cudaGetLastError();
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    // A checkpoint's mapping (pageable): gather the rows on the host, then one upload; a 2-D copy
    // from pageable memory would move hundreds of thousands of small rows one by one.
    std::vector<uint8_t> host(s.bytes());
    const auto* from = static_cast<const uint8_t*>(src) + s.begin * s.inner_bytes;
    for (size_t o = 0; o < s.outer; ++o) std::memcpy(host.data() + o * width, from + o * pitch, width);
    GPTOSS_CUDA_CHECK(cudaMemcpyAsync(dst, host.data(), host.size(), cudaMemcpyHostToDevice, stream));
    GPTOSS_CUDA_CHECK(cudaStreamSynchronize(stream));  // `host` goes away
    return;
  }
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

void vocab_parallel_argmax(Communicator& comm, const GptOssConfig& full, const TpShard& shard, const float* gather,
                           int ld, int n_rows, RowMax* pairs, int32_t* ids, cudaStream_t stream, bool sampler_rule) {
  if (n_rows <= 0) return;
  const IndexRange v = shard.vocab(full);
  RowMax* mine = pairs + size_t(shard.rank) * n_rows;
  argmax_rows_slice(gather + size_t(shard.rank) * n_rows * ld, n_rows, v.size(), ld, v.begin, mine, stream);
  comm.all_gather(mine, pairs, size_t(n_rows) * sizeof(RowMax), stream);
  argmax_merge_parts(pairs, shard.world, n_rows, ids, stream, sampler_rule);
}

}  // namespace gptoss::cuda
