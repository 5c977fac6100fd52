#pragma once
// TpBackend: one Backend made of the N ranks of a tensor-parallel group (tp_shard.h says what
// each rank holds). Every call (init_kv_cache, forward, forward_greedy, forward_sample) runs on
// every rank at once; the ranks meet in their communicator's collectives mid-pass, and the
// outputs come from rank 0 (every rank ends with the same tokens/logits).
//
// Ranks of this process run on threads, one per rank, each for the backend's whole life: a
// rank's backend is created on its thread and only ever called from it (a CUDA rank keeps its
// device and stream current there). Why threads and not one process per GPU on one host: the
// ranks share one memory mapping of the checkpoint (each copies only its slices), a batch is
// handed over by pointer instead of through IPC, and there is one process to start, supervise
// and stop. Ranks in other processes (several hosts: tp_process.h) are reached through a
// TpRemoteRanks, which forwards each call to them.
//
// Failure: a rank that throws aborts every communicator of the group, so ranks blocked in a
// collective are released instead of waiting forever; the call then throws gptoss::Error
// naming the rank that failed first, and the group is down (every later call throws the same).
// Batches are validated before any rank sees them, so a malformed batch is an error for that
// call only.
#include <functional>
#include <memory>

#include "backend/backend.h"
#include "backend/parallel/communicator.h"

namespace gptoss {

// What one rank is: its communicator (owned here, outliving the backend that uses it) and its
// backend.
struct TpRank {
  std::shared_ptr<Communicator> comm;
  std::unique_ptr<Backend> backend;
};
// Builds local rank `rank` on that rank's own thread (all of them at the same time: a CUDA
// communicator's creation waits for every rank).
using TpRankFactory = std::function<TpRank(int rank)>;

// The ranks that live in other processes, as rank 0 sees them (tp_process.cpp).
class TpRemoteRanks {
 public:
  enum class Call : uint32_t { kInitKv = 1, kForward, kForwardGreedy, kForwardSample };
  virtual ~TpRemoteRanks() = default;
  // Waits until every remote rank has built its backend; throws naming a rank that failed.
  virtual void wait_ready() = 0;
  // Sends one call to every remote rank (before the local ranks start it).
  virtual void send(Call call, const KvCacheConfig* kv, const ForwardBatch* batch, const RowSampling* rows) = 0;
  // Waits for every remote rank to finish the last call sent; throws gptoss::Error naming the
  // rank that failed or went away. Called while the local ranks run the same call.
  virtual void wait_done() = 0;
  // Tells the remote ranks to give up the call under way (a local rank failed).
  virtual void abort(const std::string& why) = 0;
  // The smallest remote rank's kv_memory_available (its own bytes; 0 = no limit).
  virtual size_t kv_memory_available() const = 0;
};

// `n_local` ranks (0 .. n_local-1 of a group of `world`), the others (n_local .. world-1) behind
// `remote` (null when n_local == world).
std::unique_ptr<Backend> make_tp_backend(int world, int n_local, TpRankFactory make,
                                         std::unique_ptr<TpRemoteRanks> remote = nullptr);

// The checks a rank's forward makes, made once before the batch is handed to the ranks:
// token ids, sequence ranges, logit rows, and a page for every position the pass touches.
void validate_forward_batch(const ForwardBatch& b, const GptOssConfig& c, const KvCacheConfig& kv);

}  // namespace gptoss
