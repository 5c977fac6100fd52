#include "backend/backend_factory.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "backend/parallel/local_communicator.h"
#include "backend/parallel/tp_backend.h"
#include "backend/parallel/tp_process.h"
#include "common/error.h"
#include "model/weights.h"
#ifdef GPTOSS_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_communicator.h"
#endif

namespace gptoss {

Mxfp4Layers parse_mxfp4_layers(const std::string& spec) {
  Mxfp4Layers r;
  if (spec.empty() || spec == "experts") return r;
  if (spec == "all") {
    r.qkv = r.o = r.lm_head = true;
    return r;
  }
  size_t at = 0;
  while (at <= spec.size()) {
    size_t end = spec.find(',', at);
    if (end == std::string::npos) end = spec.size();
    std::string name = spec.substr(at, end - at);
    if (name == "qkv")
      r.qkv = true;
    else if (name == "o")
      r.o = true;
    else if (name == "lm_head")
      r.lm_head = true;
    else if (name != "experts")
      throw Error("--mxfp4-layers: unknown layer \"" + name + "\" (expected experts, all, or a comma list of qkv, o, lm_head)");
    at = end + 1;
  }
  return r;
}

namespace {

// The checks every device makes; returns nothing, throws gptoss::Error.
void check_options(const BackendOptions& o) {
  parse_mxfp4_layers(o.mxfp4_layers);  // a bad list is an error on every device
  if (o.device != "cpu" && o.device != "cuda") throw Error("unknown device \"" + o.device + "\" (expected cpu or cuda)");
  const int n = o.tensor_parallel_size;
  if (n != 1 && n != 2 && n != 4 && n != 8)
    throw Error("--tensor-parallel-size must be 1, 2, 4 or 8 (got " + std::to_string(n) + ")");
  for (int d : o.device_indices)
    if (d < 0) throw Error("--device-index: a device ordinal is 0 or more (got " + std::to_string(d) + ")");
  if (int(o.device_indices.size()) > n)
    throw Error("--device-index lists " + std::to_string(o.device_indices.size()) +
                " devices but --tensor-parallel-size is " + std::to_string(n) + " (one ordinal per rank)");
  if (o.random_loop_tokens > 0 && o.random_weights.empty())
    throw Error("--random-loop-tokens shapes --random-weights (with --model, write the loop model with "
                "`gptoss make-model --loop-tokens N`)");
  if (o.device == "cpu") {
    if (!o.random_weights.empty())
      throw Error("--random-weights builds weights on the GPU; on the CPU, write a model with "
                  "`gptoss make-model --preset " + o.random_weights + "` and pass --model");
    if (o.model_dir.empty()) throw Error("no model: pass --model DIR");
    if (parse_mxfp4_layers(o.mxfp4_layers).any())
      throw Error("--mxfp4-layers is a CUDA option (the CPU backend is the exact reference)");
    if (o.dense_dtype != "bf16")
      throw Error("--dense-dtype " + o.dense_dtype + " is a CUDA option (the CPU backend is the exact reference)");
    if (o.mxfp4_backend != "auto")
      throw Error("--mxfp4-backend " + o.mxfp4_backend + " is a CUDA option (the CPU backend is the exact reference)");
    if (o.dense_gemm != "auto")
      throw Error("--dense-gemm " + o.dense_gemm + " is a CUDA option (the CPU backend is the exact reference)");
    if (!o.device_indices.empty())
      throw Error("--device-index is a CUDA option (the CPU backend runs on the host's cores; --threads sets how many)");
  }
#ifndef GPTOSS_HAVE_CUDA
  if (o.device == "cuda") throw Error("this gptoss was built without CUDA (configure with nvcc available)");
#endif
}

// The launcher's environment when this process is one rank of a group of processes; checked
// against --tensor-parallel-size. Without --tensor-parallel-size > 1 the environment is not read.
std::optional<LaunchEnv> process_group(const BackendOptions& o) {
  if (o.tensor_parallel_size <= 1) return std::nullopt;
  auto e = launch_env_from_environment();
  if (e && e->world != o.tensor_parallel_size)
    throw Error(e->launcher + " started " + std::to_string(e->world) + " processes but --tensor-parallel-size is " +
                std::to_string(o.tensor_parallel_size) +
                ": gptoss runs one rank per process when a launcher starts it (make them equal), or one process "
                "with a thread per rank when started alone");
  return e;
}

// The CUDA ordinal of local rank `local` (`--device-index` list, else device_index + local).
int device_of(const BackendOptions& o, int local) {
  if (o.device_indices.empty()) return o.device_index + local;
  if (local >= int(o.device_indices.size()))
    throw Error("--device-index lists " + std::to_string(o.device_indices.size()) + " device(s), local rank " +
                std::to_string(local) + " needs one more");
  return o.device_indices[local];
}

GptOssConfig model_config(const BackendOptions& o) {
  if (!o.random_weights.empty()) return GptOssConfig::preset(o.random_weights);
  return GptOssConfig::from_file(o.model_dir + "/config.json");
}

// The CPU threads of one rank when `world` ranks share the process's `threads` (0: all cores).
int cpu_threads_per_rank(int threads, int ranks_here) {
  const int total = threads > 0 ? threads : int(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, total / ranks_here);
}

// One rank's backend: the CPU reference over shared weights, or a CUDA backend of the shard
// (made on the calling thread, which the rank keeps for its whole life).
TpRank make_rank(const BackendOptions& o, const std::shared_ptr<const ModelWeights>& cpu_weights, int ranks_here,
                 int rank, int local, std::unique_ptr<Communicator> comm, const CommId& id) {
  TpRank t;
  const TpShard shard{rank, o.tensor_parallel_size, o.tp_expert_sharding};
  if (o.device == "cpu") {
    t.comm = std::move(comm);
    t.backend = make_cpu_backend(cpu_weights, cpu_threads_per_rank(o.threads, ranks_here), shard, t.comm.get());
    return t;
  }
#ifdef GPTOSS_HAVE_CUDA
  const int dev = device_of(o, local);
  t.comm = make_cuda_communicator(id, rank, o.tensor_parallel_size, dev);
  BackendOptions ro = o;
  ro.tp_shard = shard;
  ro.comm = t.comm;
  ro.device_index = dev;
  t.backend = make_cuda_backend(ro);
#else
  (void)local, (void)id, (void)comm;
#endif
  return t;
}

}  // namespace

std::unique_ptr<Backend> create_backend(const BackendOptions& o) {
  check_options(o);
  const int N = o.tensor_parallel_size;
  if (N == 1) {
    if (o.device == "cpu") return make_cpu_backend(ModelWeights::load(o.model_dir, o.load_progress), o.threads);
#ifdef GPTOSS_HAVE_CUDA
    BackendOptions one = o;
    one.device_index = device_of(o, 0);
    return make_cuda_backend(one);
#endif
  }
  check_tp_shardable(model_config(o), N, o.tp_expert_sharding);
  std::shared_ptr<const ModelWeights> weights;  // CPU ranks share one mapping
  if (o.device == "cpu") weights = ModelWeights::load(o.model_dir, o.load_progress);
  CommId id{};
#ifdef GPTOSS_HAVE_CUDA
  if (o.device == "cuda") id = cuda_new_comm_id();
#endif
  if (auto e = process_group(o)) {
    if (e->rank != 0) throw Error("rank " + std::to_string(e->rank) + " of a process group runs run_tp_worker, not a backend");
    const int local = e->local_rank;
    return make_tp_process_rank0(*e, o.device == "cpu", id, [=](const CommId& gid, std::unique_ptr<Communicator> c) {
      return make_rank(o, weights, 1, 0, local, std::move(c), gid);
    });
  }
  if (o.device == "cuda" && !o.device_indices.empty() && int(o.device_indices.size()) != N)
    throw Error("--device-index lists " + std::to_string(o.device_indices.size()) + " device(s) for " +
                std::to_string(N) + " tensor-parallel ranks: give one per rank (or none: " +
                std::to_string(o.device_index) + ".." + std::to_string(o.device_index + N - 1) + ")");
  auto comms = std::make_shared<std::vector<std::unique_ptr<Communicator>>>();
  if (o.device == "cpu") *comms = make_local_communicators(N);
  else comms->resize(N);
  return make_tp_backend(N, N, [=](int r) { return make_rank(o, weights, N, r, r, std::move((*comms)[r]), id); });
}

std::string describe_tensor_parallel(const BackendOptions& o) {
  std::string d = std::to_string(o.tensor_parallel_size) + " ranks, ";
  if (auto e = process_group(o))
    d += "one process each (" + e->launcher + ", rank 0 at " + e->master_addr + ":" + std::to_string(e->master_port) +
         "), this is rank " + std::to_string(e->rank);
  else
    d += "one thread each";
  return d + ", experts split by " + expert_sharding_name(o.tp_expert_sharding);
}

bool is_tp_worker(const BackendOptions& o) {
  auto e = process_group(o);
  return e && e->rank > 0;
}

int run_tp_worker(const BackendOptions& o) {
  auto e = process_group(o);
  if (!e || e->rank == 0) throw Error("run_tp_worker: this process is not a tensor-parallel worker");
  try {
    check_options(o);
    check_tp_shardable(model_config(o), o.tensor_parallel_size, o.tp_expert_sharding);
  } catch (const std::exception& ex) {
    // Rank 0 makes the same checks and says so; this rank just leaves.
    std::fprintf(stderr, "gptoss tensor-parallel rank %d: %s\n", e->rank, ex.what());
    return 1;
  }
  const int rank = e->rank, local = e->local_rank;
  return run_tp_process_worker(*e, o.device == "cpu", [&](const CommId& id, std::unique_ptr<Communicator> c) {
    std::shared_ptr<const ModelWeights> weights;
    if (o.device == "cpu") weights = ModelWeights::load(o.model_dir);
    return make_rank(o, weights, 1, rank, local, std::move(c), id);
  });
}

}  // namespace gptoss
