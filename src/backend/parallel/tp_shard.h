#pragma once
// Which slice of the model one tensor-parallel rank holds (Megatron style), as index ranges the
// CPU and CUDA backends both load and compute from, so the sharding math is written once.
//
//   attention: q heads split evenly (num_heads % world == 0, else a clear error); kv heads split
//              evenly when world <= num_kv_heads, else replicated (world % num_kv_heads == 0:
//              rank r holds kv head r / (world / num_kv_heads)); sinks follow the q heads.
//              qkv is column-parallel (each rank its heads' rows), o_proj row-parallel (its
//              heads' columns); o_proj's bias is added by rank 0 only.
//   experts:   kIntermediate: every rank holds every expert, a slice of the intermediate
//              dimension in multiples of 64 where that splits (else MXFP4 blocks of 32) (gate_up rows 2i, 2i+1 of its i; down's
//              columns of its i), down's bias on rank 0 only;
//              kExpertParallel: rank r holds whole experts [r*E/world, ...) (E % world == 0);
//              the router runs on every rank (replicated), each rank adds the weighted outputs
//              of the routed experts it holds, down's bias with them.
//   lm_head:   vocab-parallel, rows [vocab_begin, vocab_end) (uneven split allowed).
//   embedding, norms, router: replicated.
// After o_proj and after the MoE each rank holds a partial residual update; one all-reduce sum
// makes the residual stream equal on every rank again.
#include <string>

#include "model/config.h"

namespace gptoss {

enum class ExpertSharding { kIntermediate, kExpertParallel };

struct IndexRange {
  int begin = 0, end = 0;
  int size() const { return end - begin; }
  bool contains(int i) const { return i >= begin && i < end; }
};

// [begin, end) of part `rank` of `n` items cut into `world` parts as evenly as possible, in
// units of `grain` items (n % grain == 0); earlier ranks take the larger parts.
IndexRange split_range(int n, int world, int rank, int grain = 1);

struct TpShard {
  int rank = 0;
  int world = 1;
  ExpertSharding experts = ExpertSharding::kIntermediate;

  bool active() const { return world > 1; }
  bool root() const { return rank == 0; }
  IndexRange q_heads(const GptOssConfig& c) const;
  IndexRange kv_heads(const GptOssConfig& c) const;
  IndexRange intermediate(const GptOssConfig& c) const;  // kIntermediate: a multiple of 64 (or 32) wide; else all
  IndexRange experts_held(const GptOssConfig& c) const;  // kExpertParallel: a slice; else all
  IndexRange vocab(const GptOssConfig& c) const;
};

// "intermediate" | "expert" (`--tp-expert-sharding`); throws gptoss::Error naming the value.
ExpertSharding parse_expert_sharding(const std::string& s);
const char* expert_sharding_name(ExpertSharding s);

// Throws gptoss::Error with a message that names the model's numbers when `world` ranks cannot
// shard `c` (q heads, kv heads, experts, intermediate blocks); world 1 always passes.
void check_tp_shardable(const GptOssConfig& c, int world, ExpertSharding experts);

}  // namespace gptoss
