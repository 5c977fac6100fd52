#pragma once
// One-shot all-reduce over peer memory (the small messages of decode: NCCL's ~17 us per call
// would cost ~1.2 ms per 120b step at 72 calls). Every rank owns one registered region in its
// own GPU memory (signal flags + a staging buffer) that every peer can address directly (peer
// access between threads of one process, CUDA IPC between processes of one host). One kernel:
// each block copies its share of the input into its staging buffer, meets the peers at a flag
// barrier, reads the same share from every rank's staging buffer, sums in rank order (so every
// rank gets the same bits) and writes the result, then meets the peers again so no rank
// overwrites its staging buffer while a peer still reads it. The flags are epoch counters kept
// in device memory: no host involvement, stream-ordered, capturable in a CUDA graph.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace gptoss::cuda {

constexpr int kOneShotMaxRanks = 8;
constexpr int kOneShotMaxBlocks = 64;
constexpr int kOneShotThreads = 512;

// Layout of the start of each rank's registered region; the staging buffer follows.
struct OneShotSignals {
  alignas(128) uint32_t start[kOneShotMaxBlocks][kOneShotMaxRanks];  // written by peer r: its epoch
  alignas(128) uint32_t end[kOneShotMaxBlocks][kOneShotMaxRanks];
  alignas(128) uint32_t epoch[kOneShotMaxBlocks];                     // this rank's own counter
};
constexpr size_t kOneShotStagingOffset = (sizeof(OneShotSignals) + 255) / 256 * 256;

// The device addresses of every rank's region (indexed by rank), as this rank sees them.
struct OneShotPeers {
  char* region[kOneShotMaxRanks];
};

// data[i] = sum over ranks of data[i] (n floats, any alignment, n * 4 <= staging bytes).
// All ranks launch it with the same n. A peer that never arrives makes the kernel trap after
// `timeout_ns` of waiting (a launch error surfaces at the next synchronize instead of a hang).
void oneshot_all_reduce_f32(const OneShotPeers& peers, int rank, int world, float* data, size_t n,
                            uint64_t timeout_ns, cudaStream_t stream);

}  // namespace gptoss::cuda
