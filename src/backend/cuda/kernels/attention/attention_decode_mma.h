#pragma once
// The tensor-core decode attention kernel (attention_decode_mma.cu), behind attention_decode()
// (kernels.h), which takes it for the shapes it supports when the plan asks for it.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace gptoss::cuda {

// head_dim 64 and 1..8 query heads a kv head.
bool attention_decode_mma_supported(int Hq, int Hkv, int D);
// attention_decode() on tensor cores: nsplit splits a (token, kv head), merged in a cluster of
// nsplit blocks (cluster: a power of two <= kDecodeClusterMax) or written to `partial` for the
// merge launch (which the caller runs).
void attention_decode_mma(const uint16_t* q, int n, int Hq, int Hkv, int window, const float* sinks,
                          const float* inv_freq, float scaling, const TokenMeta& tm, const KvLayer& kv, int nsplit,
                          bool cluster, float* partial, uint16_t* out, cudaStream_t s);

}  // namespace gptoss::cuda
