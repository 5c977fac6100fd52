// One-shot all-reduce over peer memory: see oneshot_allreduce.h for the protocol.
#include "backend/cuda/kernels/comm/oneshot_allreduce.h"

#include <algorithm>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/kernels/comm/peer_sync.cuh"

namespace gptoss::cuda {
namespace {

// Block `blockIdx.x` of every rank meets here: thread r (< world) tells rank r that this rank's
// block has reached epoch `epoch`, then waits until rank r's block has told this rank the same.
// The __syncthreads before makes the block's earlier writes (staging copy) or reads (peer sums)
// happen before the flag; the fence makes them visible to the other GPUs first.
__device__ __forceinline__ void block_barrier(const OneShotPeers& peers, int rank, int world,
                                              size_t flags_offset, uint32_t epoch,
                                              uint64_t timeout_ns) {
  __syncthreads();
  const int r = threadIdx.x;
  if (r < world) {
    __threadfence_system();
    auto* peer_flags = reinterpret_cast<uint32_t*>(peers.region[r] + flags_offset);
    store_release_sys(peer_flags + blockIdx.x * kOneShotMaxRanks + rank, epoch);
    const auto* my_flags = reinterpret_cast<const uint32_t*>(peers.region[rank] + flags_offset);
    const uint32_t* wait_on = my_flags + blockIdx.x * kOneShotMaxRanks + r;
    const uint64_t t0 = global_timer_ns();
    uint32_t spins = 0;
    while (load_acquire_sys(wait_on) != epoch) {
      if (++spins % 1024 == 0 && global_timer_ns() - t0 > timeout_ns) {
        printf("gptoss: one-shot all-reduce: rank %d waited %.0f s for rank %d (block %d); a peer "
               "is gone or stuck\n", rank, timeout_ns * 1e-9, r, blockIdx.x);
        __trap();
      }
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kOneShotThreads)
oneshot_all_reduce_kernel(OneShotPeers peers, int rank, int world, float* data, size_t n,
                          uint64_t timeout_ns) {
  auto* my_signals = reinterpret_cast<OneShotSignals*>(peers.region[rank]);
  const uint32_t epoch = my_signals->epoch[blockIdx.x] + 1;

  // The elements this block handles are fixed by (block, n, grid), the same on every rank:
  // float4 index i = blockIdx.x * blockDim.x + threadIdx.x, stride gridDim.x * blockDim.x,
  // plus the scalar tail (n % 4 elements) on block 0.
  const size_t n4 = n / 4;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  const size_t first = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  float* my_staging = reinterpret_cast<float*>(peers.region[rank] + kOneShotStagingOffset);
  // Which elements a block handles depends on n only (never on `data`'s alignment, which may
  // differ between ranks); an unaligned `data` is just read and written a float at a time.
  const bool aligned = reinterpret_cast<uintptr_t>(data) % 16 == 0;
  for (size_t i = first; i < n4; i += stride)
    reinterpret_cast<float4*>(my_staging)[i] =
        aligned ? reinterpret_cast<const float4*>(data)[i]
                : make_float4(data[4 * i], data[4 * i + 1], data[4 * i + 2], data[4 * i + 3]);
  const size_t tail = n4 * 4 + threadIdx.x;
  if (blockIdx.x == 0 && tail < n) my_staging[tail] = data[tail];

  block_barrier(peers, rank, world, offsetof(OneShotSignals, start), epoch, timeout_ns);

  for (size_t i = first; i < n4; i += stride) {
    // __ldcg: past L1, which is not coherent with the peers' writes.
    float4 s = __ldcg(reinterpret_cast<const float4*>(peers.region[0] + kOneShotStagingOffset) + i);
    for (int r = 1; r < world; ++r) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(peers.region[r] + kOneShotStagingOffset) + i);
      s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
    }
    if (aligned) {
      reinterpret_cast<float4*>(data)[i] = s;
    } else {
      data[4 * i] = s.x; data[4 * i + 1] = s.y; data[4 * i + 2] = s.z; data[4 * i + 3] = s.w;
    }
  }
  if (blockIdx.x == 0 && tail < n) {
    float s = __ldcg(reinterpret_cast<const float*>(peers.region[0] + kOneShotStagingOffset) + tail);
    for (int r = 1; r < world; ++r) s += __ldcg(reinterpret_cast<const float*>(peers.region[r] + kOneShotStagingOffset) + tail);
    data[tail] = s;
  }

  // No rank may refill its staging buffer (next call) before every peer has read it.
  block_barrier(peers, rank, world, offsetof(OneShotSignals, end), epoch, timeout_ns);
  if (threadIdx.x == 0) my_signals->epoch[blockIdx.x] = epoch;
}

}  // namespace

void oneshot_all_reduce_f32(const OneShotPeers& peers, int rank, int world, float* data, size_t n,
                            uint64_t timeout_ns, cudaStream_t stream) {
  if (n == 0) return;
  const size_t n4 = std::max<size_t>(n / 4, 1);
  // Enough blocks that each thread moves a few float4 per peer; capped so the barrier stays cheap.
  const int blocks = int(std::min<size_t>(kOneShotMaxBlocks, (n4 + kOneShotThreads * 2 - 1) / (kOneShotThreads * 2)));
  oneshot_all_reduce_kernel<<<std::max(blocks, 1), kOneShotThreads, 0, stream>>>(peers, rank, world, data, n,
                                                                                 timeout_ns);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda
