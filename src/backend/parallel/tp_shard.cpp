#include "backend/parallel/tp_shard.h"

#include "common/error.h"

namespace gptoss {

IndexRange split_range(int n, int world, int rank, int grain) {
  const int units = n / grain, base = units / world, extra = units % world;
  const int b = rank * base + (rank < extra ? rank : extra);
  const int e = b + base + (rank < extra ? 1 : 0);
  return {b * grain, e * grain};
}

IndexRange TpShard::q_heads(const GptOssConfig& c) const { return split_range(c.num_heads, world, rank); }

IndexRange TpShard::kv_heads(const GptOssConfig& c) const {
  if (world <= c.num_kv_heads) return split_range(c.num_kv_heads, world, rank);
  const int per_head = world / c.num_kv_heads;  // ranks sharing one replicated kv head
  const int h = rank / per_head;
  return {h, h + 1};
}

IndexRange TpShard::intermediate(const GptOssConfig& c) const {
  if (experts != ExpertSharding::kIntermediate) return {0, c.intermediate};
  // Slices in multiples of 64 where the model allows it (120b/20b: 2880 -> 1472 + 1408 at TP=2):
  // the fragment layout's K chunk, so the tensor-core decode kernels and the v2 prefill GEMM take
  // down's slice (1440 would fall back to the CUDA-core kernels). MXFP4 blocks of 32 otherwise.
  const int grain = c.intermediate % 64 == 0 && c.intermediate / 64 >= world ? 64 : 32;
  return split_range(c.intermediate, world, rank, grain);
}

IndexRange TpShard::experts_held(const GptOssConfig& c) const {
  if (experts != ExpertSharding::kExpertParallel) return {0, c.num_experts};
  return split_range(c.num_experts, world, rank);
}

IndexRange TpShard::vocab(const GptOssConfig& c) const { return split_range(c.vocab, world, rank); }

ExpertSharding parse_expert_sharding(const std::string& s) {
  if (s == "intermediate") return ExpertSharding::kIntermediate;
  if (s == "expert") return ExpertSharding::kExpertParallel;
  throw Error("--tp-expert-sharding must be intermediate or expert, not '" + s + "'");
}

const char* expert_sharding_name(ExpertSharding s) {
  return s == ExpertSharding::kExpertParallel ? "expert" : "intermediate";
}

void check_tp_shardable(const GptOssConfig& c, int world, ExpertSharding experts) {
  if (world < 1) throw Error("--tensor-parallel-size must be at least 1");
  if (world == 1) return;
  auto n = [](int v) { return std::to_string(v); };
  if (c.num_heads % world != 0)
    throw Error("--tensor-parallel-size " + n(world) + " does not divide the model's " + n(c.num_heads) +
                " attention heads");
  if (world <= c.num_kv_heads ? c.num_kv_heads % world != 0 : world % c.num_kv_heads != 0)
    throw Error("--tensor-parallel-size " + n(world) + " and the model's " + n(c.num_kv_heads) +
                " kv heads: one must divide the other");
  if (experts == ExpertSharding::kExpertParallel) {
    if (c.num_experts % world != 0)
      throw Error("--tp-expert-sharding expert: --tensor-parallel-size " + n(world) + " does not divide the model's " +
                  n(c.num_experts) + " experts");
  } else if (c.intermediate % 32 != 0 || c.intermediate / 32 < world) {
    throw Error("--tp-expert-sharding intermediate: the model's intermediate size " + n(c.intermediate) +
                " has fewer MXFP4 blocks of 32 than --tensor-parallel-size " + n(world) +
                " (use --tp-expert-sharding expert)");
  }
}

}  // namespace gptoss
