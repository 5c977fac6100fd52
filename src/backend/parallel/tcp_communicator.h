#pragma once
// The CPU backend's collectives between processes: over a TcpStar (rank 0 in the middle), with
// the sums taken on rank 0 in rank order (d0 + d1 + ...), so every rank gets the same bits as
// the in-process communicator gives. Correct and deterministic rather than fast: the CPU path
// is the reference and the CI test of the multi-process launcher; GPUs use NCCL.
#include <memory>

#include "backend/parallel/communicator.h"
#include "backend/parallel/tcp_star.h"

namespace gptoss {

std::unique_ptr<Communicator> make_tcp_communicator(std::unique_ptr<TcpStar> links);

}  // namespace gptoss
