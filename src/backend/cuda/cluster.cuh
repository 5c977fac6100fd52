#pragma once
// Thread-block cluster helpers: split barriers, another block's shared memory, and one float
// summed over the cluster in a fixed order (moe_combine's and the LL all-reduce's next-layer
// RMSNorm: a row's sum of squares spread over the cluster's blocks).
#include <cooperative_groups.h>

#include "backend/cuda/device_utils.cuh"

namespace gptoss::cuda {

// Split cluster barriers (PTX ISA 8.0). A block may store into another's shared memory only once
// every block of the cluster has started: arrive (relaxed) at the kernel's start, wait before the
// first remote store. arrive's release and wait's acquire publish the stores made before them.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_sync_all() {
  cluster_arrive();
  cluster_wait();
}
// p (this block's shared memory) as seen in block `rank` of the cluster.
template <typename T>
__device__ __forceinline__ T* in_block(T* p, int rank) {
  return cooperative_groups::this_cluster().map_shared_rank(p, rank);
}

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
