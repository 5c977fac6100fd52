// Two-shot all-reduce over peer memory: see twoshot_allreduce.h for the protocol.
#include "backend/cuda/kernels/comm/twoshot_allreduce.h"

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels/comm/peer_sync.cuh"
#include "common/error.h"

namespace gptoss::cuda {
namespace {

constexpr int kThreads = 512;

// Area layout: [flags: 2 barriers x blocks x ranks][inbox: world x shard][result: world x shard].
constexpr size_t kFlagsBytes = 2 * kTwoShotMaxBlocks * kTwoShotMaxRanks * sizeof(uint32_t);
__host__ __device__ inline size_t shard_cap(size_t max_floats, int world) {
  return (max_floats + 4 * world - 1) / (4 * world) * 4;
}

__device__ __forceinline__ uint32_t* flag_at(char* area, int barrier, int block, int src) {
  return reinterpret_cast<uint32_t*>(area) + (size_t(barrier) * kTwoShotMaxBlocks + block) * kTwoShotMaxRanks + src;
}
__device__ __forceinline__ float* inbox_at(char* area, size_t cap, int src) {
  return reinterpret_cast<float*>(area + kFlagsBytes) + size_t(src) * cap;
}
__device__ __forceinline__ float* result_at(char* area, size_t cap, int world, int shard) {
  return reinterpret_cast<float*>(area + kFlagsBytes) + (size_t(world) + shard) * cap;
}

// Block blockIdx.x of every rank meets here (see the LL kernel's reasoning in the header): the
// block's earlier stores happen before the flag (bar.sync, then a system fence and a release).
__device__ __forceinline__ void block_barrier(const TwoShotPeers& p, int barrier, uint32_t epoch) {
  __syncthreads();
  const int r = threadIdx.x;
  if (r < p.world && r != p.rank) {
    char* peer = p.area[0];
#pragma unroll
    for (int q = 1; q < kTwoShotMaxRanks; ++q) peer = q == r ? p.area[q] : peer;
    __threadfence_system();
    store_release_sys(flag_at(peer, barrier, blockIdx.x, p.rank), epoch);
    const uint32_t* mine = flag_at(p.own, barrier, blockIdx.x, r);
    const uint64_t t0 = global_timer_ns();
    uint32_t spins = 0;
    while (load_acquire_sys(mine) != epoch) check_wait(spins, t0, p.timeout_ns, p.abort_flag, "two-shot all-reduce", p.rank, r, epoch);
  }
  __syncthreads();
}

// Up to four floats of `data` from element e0 (count valid), as a float4 (zeros past the end).
__device__ __forceinline__ float4 load4(const float* data, size_t e0, int valid, bool aligned) {
  if (aligned && valid == 4) return *reinterpret_cast<const float4*>(data + e0);
  float v[4] = {0.f, 0.f, 0.f, 0.f};
  for (int j = 0; j < valid; ++j) v[j] = data[e0 + j];
  return make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void store4(float* data, size_t e0, int valid, bool aligned, float4 v) {
  if (aligned && valid == 4) {
    *reinterpret_cast<float4*>(data + e0) = v;
    return;
  }
  const float w[4] = {v.x, v.y, v.z, v.w};
  for (int j = 0; j < valid; ++j) data[e0 + j] = w[j];
}

__global__ void __launch_bounds__(kThreads) twoshot_kernel(TwoShotPeers p, float* data, size_t n) {
  pdl_wait();
  const uint32_t epoch = epoch_begin(p.state);
  const int W = p.world, me = p.rank;
  const size_t cap = shard_cap(p.max_floats, W);
  const size_t s = (n + 4 * size_t(W) - 1) / (4 * size_t(W)) * 4;  // this call's shard, floats
  const size_t quads = s / 4, stride = size_t(gridDim.x) * blockDim.x;
  const size_t first = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool aligned = (reinterpret_cast<uintptr_t>(data) & 15) == 0;
  auto valid_at = [&](size_t e0) { return e0 >= n ? 0 : n - e0 < 4 ? int(n - e0) : 4; };

  // (1) Each other rank's shard of this rank's data into that rank's inbox.
#pragma unroll
  for (int r = 0; r < kTwoShotMaxRanks; ++r) {
    if (r >= W) break;
    if (r == me) continue;
    float4* to = reinterpret_cast<float4*>(inbox_at(p.area[r], cap, me));
    for (size_t i = first; i < quads; i += stride) {
      const size_t e0 = size_t(r) * s + 4 * i;
      const int valid = valid_at(e0);
      if (valid > 0) to[i] = load4(data, e0, valid, aligned);
    }
  }
  block_barrier(p, 0, epoch);

  // (2) This rank's shard summed in rank order, kept, and pushed to every peer's result area.
  for (size_t i = first; i < quads; i += stride) {
    const size_t e0 = size_t(me) * s + 4 * i;
    const int valid = valid_at(e0);
    if (valid == 0) continue;
    const float4 own = load4(data, e0, valid, aligned);
    float4 sum = own;
#pragma unroll
    for (int r = 0; r < kTwoShotMaxRanks; ++r) {
      if (r >= W) break;
      // __ldcg: past L1, which does not see the peers' writes.
      const float4 v = r == me ? own : __ldcg(reinterpret_cast<const float4*>(inbox_at(p.own, cap, r)) + i);
      if (r == 0) {
        sum = v;
      } else {
        sum.x += v.x; sum.y += v.y; sum.z += v.z; sum.w += v.w;
      }
    }
    store4(data, e0, valid, aligned, sum);
#pragma unroll
    for (int r = 0; r < kTwoShotMaxRanks; ++r) {
      if (r >= W) break;
      if (r != me) reinterpret_cast<float4*>(result_at(p.area[r], cap, W, me))[i] = sum;
    }
  }
  block_barrier(p, 1, epoch);

  // (3) The other shards' sums from this rank's result area.
  pdl_trigger();
  for (int r = 0; r < W; ++r) {
    if (r == me) continue;
    const float4* from = reinterpret_cast<const float4*>(result_at(p.own, cap, W, r));
    for (size_t i = first; i < quads; i += stride) {
      const size_t e0 = size_t(r) * s + 4 * i;
      const int valid = valid_at(e0);
      if (valid > 0) store4(data, e0, valid, aligned, __ldcg(from + i));
    }
  }
  epoch_end(p.state, epoch);
}

}  // namespace

size_t twoshot_area_bytes(size_t max_floats, int world) {
  return kFlagsBytes + 2 * size_t(world) * shard_cap(max_floats, world) * sizeof(float);
}

void twoshot_all_reduce_f32(const TwoShotPeers& peers, float* data, size_t n, cudaStream_t stream) {
  if (n == 0 || peers.world < 2) return;
  if (n > peers.max_floats)
    throw Error("two-shot all-reduce: " + std::to_string(n) + " floats exceed its areas");
  const size_t quads = (n + 4 * size_t(peers.world) - 1) / (4 * size_t(peers.world));
  // A few float4 a thread and shard; every block resident at once (the peers' blocks wait on each other).
  const int blocks = int(std::clamp<size_t>((quads + 4 * kThreads - 1) / (4 * kThreads), 1, kTwoShotMaxBlocks));
  launch_pdl(twoshot_kernel, dim3(blocks), dim3(kThreads), 0, stream, peers, data, n);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda
