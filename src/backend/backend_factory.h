#pragma once
// Builds the backend a command line asks for (`--device cpu|cuda`, `--model DIR` or
// `--random-weights 120b|20b`), so tools and the server never name a concrete backend.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/parallel/communicator.h"
#include "backend/parallel/tp_shard.h"
#include "model/load_progress.h"

namespace gptoss {

struct BackendOptions {
  std::string device = "cpu";        // "cpu" | "cuda"
  std::string model_dir;             // a Hugging Face checkpoint directory, or
  std::string random_weights;        // a preset ("120b", "20b", "tiny") whose random weights the backend builds itself (cuda)
  uint64_t seed = 0;                 // for random weights
  int random_loop_tokens = 0;        // random weights as a loop model of this cycle (model/make_model.h LoopSpec)
  std::string mxfp4_layers = "experts";  // see parse_mxfp4_layers (cuda)
  std::string mxfp4_backend = "auto";    // MXFP4 kernel family (cuda): auto, mma (tensor-core skinny + GEMM), gemv (CUDA-core GEMV + GEMM)
  std::string dense_dtype = "bf16";      // cuda decode copies of q/k/v/o and lm_head: bf16 (exact) or fp8 (e4m3, scale per row)
  // cuda prefill GEMMs of the dense bf16 layers (qkv, o_proj, router): auto (cuBLASLt when it
  // loads, else our own), cublas (the same, saying so on stderr when it cannot load) or own.
  // auto yields to GPTOSS_DENSE_GEMM when that is set.
  std::string dense_gemm = "auto";
  int threads = 0;                   // cpu: 0 = all cores
  int device_index = 0;              // cuda: the device of a single-GPU backend, and of each TP rank's backend
  // `--device-index 0,1`: the CUDA ordinals of the ranks of this process (one host: one per
  // rank; launched per rank: the LOCAL_RANK-th). Empty: device_index + local rank.
  std::vector<int> device_indices;
  // `--tensor-parallel-size N`: the model split over N ranks (backend/parallel/tp_shard.h); on
  // one host N threads of this process, under torchrun/Slurm/mpirun one rank per process.
  int tensor_parallel_size = 1;
  ExpertSharding tp_expert_sharding = ExpertSharding::kIntermediate;  // `--tp-expert-sharding`
  // `--batch-invariant`: each row's numerics independent of its batch companions, the batch size
  // and chunking (fixed reduction order per row, one kernel family whatever the row count), so
  // greedy outputs do not change under load or preemption. Read by the CUDA backend; the CPU
  // backend is batch-invariant always.
  bool batch_invariant = false;
  // Called while weights load and convert (see model/load_progress.h); may be empty. The CPU
  // backend reports reading the checkpoint; the CUDA backend is to report its stages too.
  LoadProgressFn load_progress;
  // Tensor parallelism (set by the TP factory for each rank): the slice this backend holds and
  // the communicator of its group. world 1 / null: the whole model on one device.
  TpShard tp_shard;
  std::shared_ptr<Communicator> comm;
};

// With tensor_parallel_size > 1: a TpBackend over the ranks (threads here, or, when a launcher
// started one process per rank, this process's rank 0 plus the others over TCP). Each rank's
// backend is built from a copy of `opts` with tp_shard, comm and device_index set, on the rank's
// own thread, which alone calls and destroys it.
std::unique_ptr<Backend> create_backend(const BackendOptions& opts);

// "2 ranks, one thread each, experts split by intermediate", or "... one process each (torchrun),
// this is rank 0": for start-up banners.
std::string describe_tensor_parallel(const BackendOptions& opts);

// True in a process that a launcher (torchrun, Slurm, mpirun: RANK/WORLD_SIZE, ...) started as
// a tensor-parallel rank other than 0: such a process runs run_tp_worker instead of its command
// (no HTTP, no tokenizer). Throws gptoss::Error on an inconsistent environment.
bool is_tp_worker(const BackendOptions& opts);
// Builds this process's rank and serves rank 0's calls until rank 0 stops the group (exit code
// 0) or fails or goes away (a message on stderr, exit code 1).
int run_tp_worker(const BackendOptions& opts);

// `--mxfp4-layers`: dense layers quantized to MXFP4 at load (the experts are MXFP4 as published).
// "experts" (or empty): none; "all": qkv, o and lm_head; or a comma list of qkv, o, lm_head.
// Throws gptoss::Error on an unknown name.
struct Mxfp4Layers {
  bool qkv = false, o = false, lm_head = false;
  bool any() const { return qkv || o || lm_head; }
};
Mxfp4Layers parse_mxfp4_layers(const std::string& spec);

}  // namespace gptoss
