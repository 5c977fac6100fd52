#pragma once
// Tensor-parallel collectives between CUDA ranks (implemented in cuda_communicator.cpp, owned by
// the CUDA backend): NCCL underneath, loaded at run time, plus a one-shot all-reduce over peer
// memory for the small messages of decode. Declared here so the backend factory can create the
// communicator of each rank without knowing how it works.
#include <memory>

#include "backend/parallel/communicator.h"

namespace gptoss {

// The communicator make_cuda_communicator returns, with its two all-reduce paths reachable one
// by one for the tests and `gptoss bench-allreduce`.
class CudaCommunicator : public Communicator {
 public:
  // all_reduce_sum takes the one-shot path up to this many bytes (0: one-shot unavailable,
  // e.g. ranks on different hosts); GPTOSS_ALLREDUCE_ONESHOT_MAX sets it (default 8 KiB, from
  // bench-allreduce on two H200s).
  virtual size_t oneshot_max_bytes() const = 0;
  virtual void nccl_all_reduce(float* data, size_t n, void* stream) = 0;
  virtual void oneshot_all_reduce(float* data, size_t n, void* stream) = 0;  // n * 4 <= oneshot_max_bytes()
};

// Rank 0 makes the group's id (ncclGetUniqueId) and hands it to every rank.
CommId cuda_new_comm_id();

// Joins rank `rank` of a `world`-rank group on CUDA device `device`. Blocks until every rank has
// joined, so the ranks of one process call it from their own threads at the same time.
std::unique_ptr<Communicator> make_cuda_communicator(const CommId& id, int rank, int world, int device);

}  // namespace gptoss
