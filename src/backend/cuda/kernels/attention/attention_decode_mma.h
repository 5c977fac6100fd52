#pragma once
// The tensor-core decode attention kernel (attention_decode_mma.cu), behind attention_decode()
// (kernels.h), which takes it for the shapes it supports when the plan asks for it.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace gptoss::cuda {

// decode_attention_plan() for this kernel (measured on the H200, `bench-kernels --attention-only`):
// - one split while the keys fit 3 tiles of 64 (sliding layers): its tiles load at once, and a
//   cluster's sync and merge cost more than a second block saves;
// - else a cluster of up to one split a tile, as many as one wave holds (528 blocks: 4 an SM at
//   this kernel's ~52 KB of shared memory; 396 for clusters of 4 or more, which the scheduler
//   must place whole within a GPC);
// - split-and-merge when the context is long: with split_nsplit splits when that is more than the
//   cluster's and a cluster split would walk more than 4 tiles, and with the cluster's count when
//   a split would walk more than 8 tiles (the merge launch costs less than long clustered blocks).
DecodeAttentionPlan decode_attention_mma_plan(int n, int Hkv, int max_keys, int split_nsplit, int max_cluster);
// head_dim 64 and 1..8 query heads a kv head.
bool attention_decode_mma_supported(int Hq, int Hkv, int D);
// attention_decode() on tensor cores: nsplit splits a (token, kv head), merged in a cluster of
// nsplit blocks (cluster: a power of two <= kDecodeClusterMax) or written to `partial` for the
// merge launch (which the caller runs). kv_stored: rope_kv_store already ran over the pass (q
// rotated in place, every token's K/V in the pages), so tokens of one sequence may share the pass.
// row_first: the blocks ask for their q, k, v row before their ring of K/V tiles (where the kernel
// before lets no dependent launch start early, so the wait costs nothing; attention_decode says).
void attention_decode_mma(const uint16_t* q, int n, int Hq, int Hkv, int window, const float* sinks,
                          const float* inv_freq, float scaling, const TokenMeta& tm, const KvLayer& kv, int nsplit,
                          bool cluster, bool kv_stored, float* partial, uint16_t* out, cudaStream_t s,
                          bool row_first = false);

}  // namespace gptoss::cuda
