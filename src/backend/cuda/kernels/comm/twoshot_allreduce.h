#pragma once
// Two-shot all-reduce over peer memory for large messages (prefill's residual: 2048 tokens are
// 23.6 MB, where NCCL's ring moved ~230 GB/s on two NVLinked H200s). Experimental, off unless
// GPTOSS_ALLREDUCE_TWOSHOT_MAX is set (cuda_communicator.cpp); bench-allreduce times it.
//
// The message is cut into `world` shards, shard r owned by rank r. (1) Every rank pushes each
// other rank's shard of its data into that rank's inbox (slot = source rank), 16-byte stores over
// NVLink; a flag barrier per block. (2) Each owner sums its shard in rank order (its own part from
// its data), keeps the sum and pushes it into every peer's result area; a second flag barrier.
// (3) Each rank copies the other shards' sums from its result area into its data. Every element
// crosses each link once each way, as in NCCL's ring, but with every SM pushing and no pipeline
// steps. All ranks end with the same bits (one owner sums each element).
//
// Reuse without a third barrier: a rank's next call begins after its call ended, which waited at
// barrier 2 for every peer block to have finished reading its inbox; no rank refills a peer's
// inbox or result area before the peer is done with them. Flags carry the call's epoch (a device
// counter, as the LL kernel's): stream-ordered, capturable in CUDA graphs.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace gptoss::cuda {

constexpr int kTwoShotMaxRanks = 8;
constexpr int kTwoShotMaxBlocks = 128;

// What the communicator owns for the two-shot kernel, as this rank sees it.
struct TwoShotPeers {
  char* area[kTwoShotMaxRanks];  // every rank's area (twoshot_area_bytes), this rank's at [rank]
  char* own = nullptr;           // area[rank]
  size_t max_floats = 0;         // the largest message
  uint32_t* state = nullptr;     // this rank's [epoch, blocks done], zero at first
  int rank = 0, world = 1;
  uint64_t timeout_ns = 0;
  const volatile uint32_t* abort_flag = nullptr;  // as LLPeers'
};
size_t twoshot_area_bytes(size_t max_floats, int world);

// data[i] = sum over ranks of data[i] in rank order, n floats (any alignment), n <= max_floats.
void twoshot_all_reduce_f32(const TwoShotPeers& peers, float* data, size_t n, cudaStream_t stream);

}  // namespace gptoss::cuda
