#pragma once
// One float summed over a thread-block cluster in a fixed order (moe_combine's and the LL
// all-reduce's next-layer RMSNorm: a row's sum of squares spread over the cluster's blocks).
#include <cooperative_groups.h>

#include "backend/cuda/device_utils.cuh"

namespace gptoss::cuda {

// Every thread's v summed over its block of THREADS threads (warps, then the warps in order) and
// then over the cluster's BLOCKS blocks in rank order, so every thread of every block gets the
// same float whatever the scheduling. Each block must stay alive (a cluster barrier before it
// exits) until every block has read its partial sum.
template <int THREADS, int BLOCKS>
__device__ __forceinline__ float cluster_sum(cooperative_groups::cluster_group& cluster, float v) {
  __shared__ float red[THREADS / 32];
  __shared__ float block_sum;
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float b = 0.f;
    for (int i = 0; i < THREADS / 32; ++i) b += red[i];
    block_sum = b;
  }
  cluster.sync();  // every block's partial sum is in its block_sum
  float total = 0.f;
  for (int b = 0; b < BLOCKS; ++b) total += *cluster.map_shared_rank(&block_sum, b);  // same order everywhere
  return total;
}

}  // namespace gptoss::cuda
