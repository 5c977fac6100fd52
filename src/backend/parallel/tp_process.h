#pragma once
// Tensor parallelism across processes (several hosts, or one process per GPU started by a
// launcher): the same binary started once per rank. Rank 0 listens on MASTER_ADDR:MASTER_PORT,
// the others connect (tcp_star.h); rank 0 sends the group's CommId (NCCL's unique id for CUDA
// groups) and then, for every backend call, the call and its ForwardBatch (page tables
// included) over the control channel; the workers run the same call on their shard and answer
// ok or the error. A worker that dies closes its socket: rank 0's call fails naming it (the
// group is down). Rank 0 that exits (or fails) closes its sockets: the workers stop.
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "backend/parallel/tp_backend.h"

namespace gptoss {

// Where this process stands in a group started by a launcher.
struct LaunchEnv {
  int rank = 0, world = 1, local_rank = 0;
  std::string master_addr;
  int master_port = 29500;
  std::string launcher;  // "torchrun" (RANK/WORLD_SIZE), "slurm", "openmpi": for messages
};

// Reads torchrun/Kubernetes (RANK, WORLD_SIZE, LOCAL_RANK), Slurm (SLURM_PROCID,
// SLURM_STEP_NUM_TASKS or SLURM_NTASKS, SLURM_LOCALID) or OpenMPI (OMPI_COMM_WORLD_RANK/SIZE/
// LOCAL_RANK), in that order of precedence, plus MASTER_ADDR / MASTER_PORT (default 29500;
// MASTER_PORT + 1 under torchrun, whose agent holds MASTER_PORT; GPTOSS_TP_PORT overrides).
// nullopt when no launcher set a world of more than one process. Throws gptoss::Error naming the
// variable on a malformed value or a missing MASTER_ADDR.
std::optional<LaunchEnv> launch_env_from_environment();

// This process's own rank, made from the group's id and (`cpu_links`) the CPU collectives'
// communicator the rendezvous built (null for CUDA ranks, which make their own from the id).
using TpProcessRankFactory = std::function<TpRank(const CommId& id, std::unique_ptr<Communicator> cpu_comm)>;

// Rank 0: meets the workers, sends them `id`, builds its own rank and returns the group's
// backend. `cpu_links`: also open the channel the CPU communicator runs over.
std::unique_ptr<Backend> make_tp_process_rank0(const LaunchEnv& env, bool cpu_links, const CommId& id,
                                               TpProcessRankFactory make);

// Ranks > 0: meets rank 0, builds this rank and runs rank 0's calls until it says stop (0) or
// fails or goes away (the reason on stderr, 1).
int run_tp_process_worker(const LaunchEnv& env, bool cpu_links, TpProcessRankFactory make);

}  // namespace gptoss
