#pragma once
// Host helpers of the CUDA backend's tensor-parallel shards: cutting a rank's slice out of a
// full weight tensor, the rank's local model shape, and the vocab-parallel lm_head's gather.
#include <cuda_runtime.h>

#include <cstddef>

#include "backend/cuda/kernels.h"
#include "backend/parallel/communicator.h"
#include "backend/parallel/tp_shard.h"
#include "model/config.h"

namespace gptoss::cuda {

// A tensor viewed as [outer][mid][inner_bytes]; the slice keeps mid rows [begin, begin + count)
// of every outer index: row slices (outer 1), per-expert row slices (outer E), column slices
// (outer = rows, inner = one element or one MXFP4 block).
struct MidSlice {
  size_t outer, mid, inner_bytes, begin, count;
  size_t bytes() const { return outer * count * inner_bytes; }
};
// dst (device) <- the slice of src (device memory, or host memory such as a checkpoint mapping),
// [outer][count][inner_bytes], on `stream` (a host source is copied before this returns).
void copy_mid_slice(void* dst, const void* src, const MidSlice& s, cudaStream_t stream);

// The shape this rank computes with: its q heads, kv heads and intermediate slice; hidden,
// experts and vocab stay whole (the lm_head slice is handled apart).
GptOssConfig tp_local_config(const GptOssConfig& full, const TpShard& shard);

// Vocab-parallel logits: each rank wrote its rows' logits for its vocab slice into
// `gather + rank * n_rows * ld` (row stride ld = the widest slice); gathers every rank's part
// and lays the full rows out in `logits` ([n_rows][vocab]). All on `stream` (capturable).
void gather_vocab_logits(Communicator& comm, const GptOssConfig& full, const TpShard& shard, float* gather, int ld,
                         int n_rows, float* logits, cudaStream_t stream);
// Vocab-parallel greedy without gathering the logits: each rank's row maxima over its slice
// (`gather + rank * n_rows * ld`, as lm_head left them) as (value, id) pairs, 8 bytes a row,
// all-gathered into `pairs` ([world][n_rows]) and merged in rank order into ids[0, n_rows): the
// ids argmax_rows picks from the gathered rows (sampler_rule: sample_rows' at temperature 0),
// the same on every rank. On `stream` (capturable).
void vocab_parallel_argmax(Communicator& comm, const GptOssConfig& full, const TpShard& shard, const float* gather,
                           int ld, int n_rows, RowMax* pairs, int32_t* ids, cudaStream_t stream,
                           bool sampler_rule = false);
// The widest vocab slice of the group (the gather's row stride).
int tp_max_vocab_slice(const GptOssConfig& full, const TpShard& shard);

}  // namespace gptoss::cuda
