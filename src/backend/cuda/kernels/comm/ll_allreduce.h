#pragma once
// Low-latency ("LL", after NCCL's protocol of that name) all-reduce over peer memory, for the
// residual stream of tensor-parallel decode, optionally fused with the MoE combine before it and
// the next layer's RMSNorm after it.
//
// Each rank owns a receive area in its own GPU memory that every peer can address (peer access
// between threads of one process, CUDA IPC between processes of one host): per parity (0/1) and
// per source rank, one 16-byte slot for every two floats of the message, {a, flag, b, flag}.
// Every thread pushes its share of this rank's contribution into each peer's slots with 16-byte
// volatile stores whose flag words carry the call's epoch, then waits in its own memory for the
// peers' slots of the same elements to show the epoch in both flag words (NCCL's LL protocol:
// the flag sits beside the data in one store, so no fence and no separate signal is needed), and
// sums the contributions in rank order (every rank gets the same bits). No barrier at all.
//
// Reuse of a slot is safe without one: calls alternate between two slot sets (the epoch's
// parity), and a rank starts call e only after its call e-1 ended, which saw data every peer
// wrote in ITS call e-1, which that peer began only after its call e-2 (the last reader of the
// set that call e writes) had finished. The epoch is a counter in device memory that every call's
// blocks read and the last block to finish advances: stream-ordered, no host involvement,
// capturable in CUDA graphs.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/kernels.h"

namespace gptoss::cuda {

constexpr int kLLMaxRanks = 8;

// What the communicator owns for the LL kernels, as this rank sees it.
struct LLPeers {
  char* area[kLLMaxRanks];  // every rank's receive area (this rank's own at [rank])
  char* own = nullptr;      // area[rank] (the kernels index `area` by constants only)
  size_t slots = 0;         // slots per (parity, source rank): capacity of 2 * slots floats
  uint32_t* state = nullptr;  // this rank's [epoch, blocks done], zero at first
  int rank = 0, world = 1;
  uint64_t timeout_ns = 0;  // a peer that never comes: the kernel traps after waiting this long
  const volatile uint32_t* abort_flag = nullptr;  // host memory the device reads: nonzero = trap now
};
// Bytes of one rank's receive area for messages of up to `max_floats` floats.
size_t ll_area_bytes(size_t max_floats, int world);

// data[i] = sum over ranks of data[i], n floats (any alignment), n <= 2 * peers.slots.
void ll_all_reduce_f32(const LLPeers& peers, float* data, size_t n, cudaStream_t stream);

// The residual update of a row-parallel layer, made whole on every rank:
//   x[t] = sum over ranks r (in rank order) of c_r[t], where this rank's
//   c[t] = (add_x ? x[t] : 0) + sum_j topk_w[t, j] * y[slot_pair[t, j]]  (j = 0..k-1, combine given)
//        = x[t]                                                          (no combine; add_x is then required)
// and, with norm_w, xn[t] = bf16(rmsnorm(x[t]) * norm_w), the next layer's input.
// With add_x on rank 0 only this is moe_combine into a residual zeroed off rank 0, then an
// all-reduce, then rmsnorm: the same sums (expert terms in order j, ranks in order r).
struct ResidualAllReduce {
  float* x = nullptr;  // [n][H] f32: in, then out
  int n = 0, H = 0;    // H even
  bool add_x = true;
  const float* y = nullptr;  // combine: expert outputs [pairs][H]; null: none
  MoeRouting routing{};
  int k = 0;
  const float* norm_w = nullptr;  // null: no norm
  float eps = 0.f;
  bf16_t* xn = nullptr;
};
// recv = every rank's `bytes` bytes at `send`, in rank order (recv holds world * bytes; send may
// alias recv + rank * bytes): the same slots and epochs, 8 bytes a slot (bytes % 8 == 0,
// bytes / 8 <= peers.slots; any alignment). For the small gathers of decode (the vocab-parallel
// greedy's (value, id) pairs), where NCCL's latency is most of the cost.
void ll_all_gather(const LLPeers& peers, const void* send, void* recv, size_t bytes, cudaStream_t stream);

// Whether ll_residual_all_reduce takes `op` (sizes fit, H even, k small enough).
bool ll_residual_fits(const LLPeers& peers, const ResidualAllReduce& op);
void ll_residual_all_reduce(const LLPeers& peers, const ResidualAllReduce& op, cudaStream_t stream);

}  // namespace gptoss::cuda
