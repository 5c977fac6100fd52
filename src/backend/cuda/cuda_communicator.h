#pragma once
// Tensor-parallel collectives between CUDA ranks (implemented in cuda_communicator.cpp, owned by
// the CUDA backend): NCCL underneath, loaded at run time, plus a one-shot all-reduce over peer
// memory for the small messages of decode. Declared here so the backend factory can create the
// communicator of each rank without knowing how it works.
#include <memory>

#include "backend/cuda/kernels/comm/ll_allreduce.h"
#include "backend/parallel/communicator.h"

namespace gptoss {

// The communicator make_cuda_communicator returns, with its all-reduce paths reachable one by
// one for the tests and `gptoss bench-allreduce`, and the residual all-reduce of TP decode.
class CudaCommunicator : public Communicator {
 public:
  // all_reduce_sum takes the peer-memory path (the LL kernel) up to this many bytes, NCCL above
  // (0: no peer memory, e.g. ranks on different hosts); GPTOSS_ALLREDUCE_ONESHOT_MAX sets it.
  virtual size_t oneshot_max_bytes() const = 0;
  // The most bytes the peer-memory kernels take when called directly (0: no peer memory).
  virtual size_t peer_capacity_bytes() const = 0;
  virtual void nccl_all_reduce(float* data, size_t n, void* stream) = 0;
  // The staged one-shot kernel (kernels/comm/oneshot_allreduce.h); n * 4 <= peer_capacity_bytes().
  virtual void oneshot_all_reduce(float* data, size_t n, void* stream) = 0;
  // The LL kernel (kernels/comm/ll_allreduce.h); n * 4 <= peer_capacity_bytes().
  virtual void ll_all_reduce(float* data, size_t n, void* stream) = 0;
  // The two-shot kernel for large messages (kernels/comm/twoshot_allreduce.h; experimental):
  // all_reduce_sum takes it above oneshot_max_bytes() up to this many bytes (0: off, the
  // default; GPTOSS_ALLREDUCE_TWOSHOT_MAX sets it).
  virtual size_t twoshot_max_bytes() const = 0;
  virtual void twoshot_all_reduce(float* data, size_t n, void* stream) = 0;  // n * 4 <= twoshot_max_bytes()
  // A row-parallel layer's residual update made whole, fused with the MoE combine and the next
  // RMSNorm as `op` asks (ll_allreduce.h). Returns false, having done nothing, when the
  // peer-memory path does not take the call (no peer memory, too many bytes, shape): the caller
  // then runs the same steps one by one.
  virtual bool residual_all_reduce(const cuda::ResidualAllReduce& op, void* stream) = 0;
};

// Rank 0 makes the group's id (ncclGetUniqueId) and hands it to every rank.
CommId cuda_new_comm_id();

// Joins rank `rank` of a `world`-rank group on CUDA device `device`. Blocks until every rank has
// joined, so the ranks of one process call it from their own threads at the same time.
std::unique_ptr<Communicator> make_cuda_communicator(const CommId& id, int rank, int world, int device);

}  // namespace gptoss
