#pragma once
// Collectives among the ranks of one tensor-parallel group. A rank's backend calls them in the
// middle of its forward pass (after attention's o_proj, after the MoE, for the lm_head shards).
// The CPU backend passes host pointers and no stream; the CUDA backend passes device pointers and
// its cudaStream_t (as void*), and the collective is ordered on that stream (capturable in a CUDA
// graph where the implementation says so).
//
// Every rank must call the same collectives in the same order with the same sizes.
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace gptoss {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // In place: data[i] = sum over ranks of data[i], n floats. Every rank ends with the same bits
  // (the sum is taken in one fixed order, so results do not depend on timing).
  virtual void all_reduce_sum(float* data, size_t n, void* stream = nullptr) = 0;
  // recv = concatenation, in rank order, of each rank's `bytes` bytes at `send`
  // (recv holds world() * bytes; send may alias recv + rank() * bytes).
  virtual void all_gather(const void* send, void* recv, size_t bytes, void* stream = nullptr) = 0;
  // Root's `bytes` bytes at `data` copied to every rank's `data`.
  virtual void broadcast(void* data, size_t bytes, int root, void* stream = nullptr) = 0;
  // Called (from any thread) when this rank, or the group's supervisor, knows the group cannot
  // finish the current call: every collective blocked now or called later on any rank of the
  // group throws gptoss::Error carrying `why` instead of waiting for a rank that will never come
  // (NCCL: ncclCommAbort). The group is unusable afterwards.
  virtual void abort(const std::string& why) { (void)why; }
};

// What a group is created from: 128 opaque bytes made once by rank 0 (NCCL's ncclUniqueId for
// CUDA groups) and handed to every rank by the launcher (in memory for threads of one process,
// over TCP for processes).
using CommId = std::array<uint8_t, 128>;

}  // namespace gptoss
