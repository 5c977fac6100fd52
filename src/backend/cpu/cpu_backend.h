#pragma once
// The exact fp32 reference backend: the oracle for every GPU kernel and the engine of the tests.
#include <memory>

#include "backend/backend.h"
#include "backend/parallel/communicator.h"
#include "backend/parallel/tp_shard.h"
#include "model/weights.h"

namespace gptoss {

// threads: 0 = all cores.
std::unique_ptr<Backend> make_cpu_backend(std::shared_ptr<const ModelWeights> weights, int threads = 0);

// One tensor-parallel rank (see backend/parallel/tp_shard.h): holds only `shard`'s slices of the
// weights (views into the mapping where a slice is contiguous, copies where it is strided) and
// of the KV cache, and meets the other ranks through `comm` (not owned; must outlive the
// backend) after attention, after the MoE and for the logits. config() is the whole model's;
// forward() writes the whole logits on every rank, forward_greedy() gathers one (value, id)
// pair per row and rank instead. A world-1 shard is the plain backend.
std::unique_ptr<Backend> make_cpu_backend(std::shared_ptr<const ModelWeights> weights, int threads,
                                          const TpShard& shard, Communicator* comm);

}  // namespace gptoss
