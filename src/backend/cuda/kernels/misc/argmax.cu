// Greedy decoding on the device: row argmax over the vocabulary, or over one tensor-parallel
// rank's vocab slice as (value, id) pairs that argmax_merge_parts makes whole.
#include <cooperative_groups.h>

#include <cstdio>
#include <string>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/kv_layout.h"

namespace gptoss::cuda {

// Row argmax: a cluster of kArgmaxBlocks blocks per row (one SM alone reads a 201088-entry row
// at a fraction of the bandwidth), 16-byte loads; the blocks' winners meet through distributed
// shared memory in the cluster's first block. Ties go to the lowest index.
constexpr int kArgmaxBlocks = 8, kArgmaxThreads = 512;

__device__ __forceinline__ void argmax_merge(float& best, int& bi, float v, int i) {
  if (v > best || (v == best && i < bi)) { best = v; bi = i; }
}

__global__ void __cluster_dims__(kArgmaxBlocks, 1, 1) __launch_bounds__(kArgmaxThreads)
    argmax_kernel(const float* __restrict__ logits, int V, int ld, int id0, int32_t* __restrict__ out,
                  RowMax* __restrict__ pairs) {
  pdl_begin();
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank());
  const int row_i = blockIdx.x / kArgmaxBlocks;
  const float* row = logits + size_t(row_i) * ld;
  // This block's slice, in whole float4s (V % 4 leftovers go to the last block).
  const int n4 = V / 4, per4 = (n4 + kArgmaxBlocks - 1) / kArgmaxBlocks;
  const int b4 = rank * per4, e4 = min(n4, b4 + per4);
  float best = -INFINITY;
  int bi = 0x7fffffff;
  const bool aligned = (reinterpret_cast<uintptr_t>(row) & 15) == 0;
  if (aligned) {
    const float4* r4 = reinterpret_cast<const float4*>(row);
    for (int i = b4 + int(threadIdx.x); i < e4; i += kArgmaxThreads) {
      float4 v = r4[i];
      argmax_merge(best, bi, v.x, 4 * i);
      argmax_merge(best, bi, v.y, 4 * i + 1);
      argmax_merge(best, bi, v.z, 4 * i + 2);
      argmax_merge(best, bi, v.w, 4 * i + 3);
    }
  } else {
    for (int i = 4 * b4 + int(threadIdx.x); i < 4 * e4; i += kArgmaxThreads) argmax_merge(best, bi, row[i], i);
  }
  if (rank == kArgmaxBlocks - 1)
    for (int i = 4 * n4 + int(threadIdx.x); i < V; i += kArgmaxThreads) argmax_merge(best, bi, row[i], i);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float ob = __shfl_xor_sync(0xffffffffu, best, o);
    int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    argmax_merge(best, bi, ob, oi);
  }
  __shared__ float sv[kArgmaxThreads / 32];
  __shared__ int si[kArgmaxThreads / 32];
  const int w = threadIdx.x / 32;
  if ((threadIdx.x & 31) == 0) { sv[w] = best; si[w] = bi; }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < kArgmaxThreads / 32; ++i) argmax_merge(best, bi, sv[i], si[i]);
    sv[0] = best;
    si[0] = bi;
  }
  cluster.sync();  // every block's winner is in its sv[0] / si[0]
  if (rank == 0 && threadIdx.x == 0) {
    for (int r = 1; r < kArgmaxBlocks; ++r)
      argmax_merge(best, bi, *cluster.map_shared_rank(&sv[0], r), *cluster.map_shared_rank(&si[0], r));
    if (pairs)  // a slice's winner keeps "none" (all NaN) as id INT32_MAX for the merge
      pairs[row_i] = RowMax{best, bi == 0x7fffffff ? bi : bi + id0};
    else
      out[row_i] = bi == 0x7fffffff ? 0 : bi;
  }
  cluster.sync();  // the other blocks' shared memory stays alive until rank 0 has read it
}

void argmax_rows(const float* logits, int n, int V, int32_t* out, cudaStream_t s) {
  if (n <= 0) return;
  launch_pdl(argmax_kernel, dim3(n * kArgmaxBlocks), dim3(kArgmaxThreads), 0, s, logits, V, V, 0, out,
             static_cast<RowMax*>(nullptr));
  GPTOSS_CUDA_LAUNCH_CHECK();
}

void argmax_rows_slice(const float* logits, int n, int V, int ld, int id0, RowMax* out, cudaStream_t s) {
  if (n <= 0) return;
  launch_pdl(argmax_kernel, dim3(n * kArgmaxBlocks), dim3(kArgmaxThreads), 0, s, logits, V, ld, id0,
             static_cast<int32_t*>(nullptr), out);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

namespace {
// One thread per row: the parts in rank order under argmax_merge's rule (largest value, lowest
// id on ties), so the pick is the one argmax_rows makes over the whole row.
__global__ void argmax_merge_parts_kernel(const RowMax* __restrict__ parts, int world, int n, int32_t* __restrict__ ids,
                                          bool sampler_rule) {
  pdl_begin();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float best = -INFINITY;
  int bi = 0x7fffffff;
  for (int r = 0; r < world; ++r) {
    const RowMax p = parts[size_t(r) * n + i];
    argmax_merge(best, bi, p.value, p.id);
  }
  ids[i] = bi == 0x7fffffff || (sampler_rule && best == -INFINITY) ? 0 : bi;
}
}  // namespace

void argmax_merge_parts(const RowMax* parts, int world, int n, int32_t* ids, cudaStream_t s, bool sampler_rule) {
  if (n <= 0) return;
  launch_pdl(argmax_merge_parts_kernel, dim3((n + 127) / 128), dim3(128), 0, s, parts, world, n, ids, sampler_rule);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda
