// The CUDA communicator: NCCL (loaded at run time) for every collective, plus the peer-memory
// all-reduce kernels (kernels/comm/ll_allreduce.h, the one all_reduce_sum and the residual
// all-reduce use; kernels/comm/oneshot_allreduce.h, the earlier staged one, kept for the bench)
// for messages up to a threshold when every rank is on this host and the GPUs can address each
// other's memory.
#include "backend/cuda/cuda_communicator.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/kernels/comm/oneshot_allreduce.h"
#include "backend/cuda/kernels/comm/twoshot_allreduce.h"
#include "backend/cuda/nccl_library.h"
#include "common/error.h"

namespace gptoss {
namespace {

using cuda::nccl;

size_t env_size(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v, &end, 10);
  if (*end) throw Error(std::string(name) + "=" + v + " is not a whole number");
  return size_t(x);
}

// A rank that waits longer than this for its peers (NCCL init, a collective, the one-shot
// barrier) gives up with an error instead of hanging: a dead peer takes the group down.
uint64_t timeout_seconds() { return env_size("GPTOSS_TP_TIMEOUT_S", 300); }

std::string nccl_error(ncclResult_t r, ncclComm_t comm) {
  std::string s = nccl().GetErrorString(r);
  const char* last = comm ? nccl().GetLastError(comm) : nullptr;
  if (last && *last) s += std::string(": ") + last;
  return s;
}

// What each rank tells the others once at init to decide whether the one-shot path can work.
struct PeerInfo {
  uint64_t host_hash = 0;
  uint64_t pid = 0;
  uint64_t region = 0;               // device address of the rank's registered region
  uint64_t region_bytes = 0;         // its layout follows from its size: every rank's must match
  uint64_t oneshot_max = 0;          // the rank's GPTOSS_ALLREDUCE_ONESHOT_MAX: the group takes the least
  uint64_t twoshot_max = 0;          // and GPTOSS_ALLREDUCE_TWOSHOT_MAX
  cudaIpcMemHandle_t ipc{};          // the same region for other processes
  int32_t device = 0;
  int32_t ok = 0;                    // this rank can use the one-shot path (second round)
};

uint64_t host_hash() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return std::hash<std::string>{}(name);
}

class CudaCommunicatorImpl final : public CudaCommunicator {
 public:
  CudaCommunicatorImpl(const CommId& id, int rank, int world, int device)
      : rank_(rank), world_(world), device_(device) {
    if (world < 1 || rank < 0 || rank >= world)
      throw Error("CUDA communicator: rank " + std::to_string(rank) + " of " + std::to_string(world));
    GPTOSS_CUDA_CHECK(cudaSetDevice(device));
    ncclUniqueId uid;
    static_assert(sizeof(uid) <= sizeof(CommId));
    std::memcpy(&uid, id.data(), sizeof(uid));
    // Non-blocking communicator: init and collectives return at once and report through
    // ncclCommGetAsyncError, which lets a timeout or a dead peer end the wait (ncclCommAbort).
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = nccl().CommInitRankConfig(&comm_, world, uid, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress)
      throw Error("NCCL init (rank " + std::to_string(rank) + " of " + std::to_string(world) +
                  ", GPU " + std::to_string(device) + "): " + nccl_error(r, nullptr));
    wait_ready("init");
    timeout_ns_ = timeout_seconds() * 1000000000ull;
    // all_reduce_sum's peer-memory (LL) path up to this size, NCCL above. The earlier staged
    // one-shot kernel only beat NCCL below ~8 KB on two NVLinked H200s (docs/BENCHMARKS.md);
    // 512 KiB (decode up to 45 rows of 2880) for the LL kernel is to be confirmed by bench-allreduce.
    oneshot_max_bytes_ = env_size("GPTOSS_ALLREDUCE_ONESHOT_MAX", 512 * 1024);
    // The kernels take up to 1 MiB when called directly (bench-allreduce's table).
    capacity_bytes_ = std::max<size_t>(oneshot_max_bytes_, size_t(1) << 20);
    // Experimental: the two-shot kernel above that, up to this size (0: NCCL there).
    twoshot_max_bytes_ = env_size("GPTOSS_ALLREDUCE_TWOSHOT_MAX", 0);
    if (world_ > 1 && world_ <= cuda::kOneShotMaxRanks && world_ <= cuda::kLLMaxRanks && oneshot_max_bytes_ > 0)
      setup_oneshot();
    watchdog_ = std::thread([this] { watch(); });
  }

  ~CudaCommunicatorImpl() override {
    stop_ = true;
    if (watchdog_.joinable()) watchdog_.join();
    // Peer regions of other processes were opened here; a thread peer's belong to its owner.
    for (void* p : opened_ipc_) cudaIpcCloseMemHandle(p);
    if (abort_flag_) cudaFreeHost(const_cast<uint32_t*>(abort_flag_));
    if (comm_) {
      if (aborted_) {
      } else if (failed_) {
        nccl().CommAbort(comm_);
      } else {
        cudaSetDevice(device_);
        if (nccl().CommFinalize(comm_) == ncclInProgress) {
          ncclResult_t s = ncclInProgress;
          const auto t0 = std::chrono::steady_clock::now();
          while (s == ncclInProgress && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30))
            nccl().CommGetAsyncError(comm_, &s);
        }
        nccl().CommDestroy(comm_);
      }
    }
  }

  int rank() const override { return rank_; }
  int world() const override { return world_; }

  size_t oneshot_max_bytes() const override { return oneshot_ ? oneshot_max_bytes_ : 0; }
  size_t peer_capacity_bytes() const override { return oneshot_ ? capacity_bytes_ : 0; }

  void all_reduce_sum(float* data, size_t n, void* stream) override {
    if (world_ == 1 || n == 0) return;
    check_alive();
    if (oneshot_ && n * sizeof(float) <= oneshot_max_bytes_) {
      cuda::ll_all_reduce_f32(ll_, data, n, cudaStream_t(stream));
      return;
    }
    if (oneshot_ && n * sizeof(float) <= twoshot_max_bytes_) {
      cuda::twoshot_all_reduce_f32(two_, data, n, cudaStream_t(stream));
      return;
    }
    nccl_all_reduce(data, n, stream);
  }

  size_t twoshot_max_bytes() const override { return oneshot_ ? twoshot_max_bytes_ : 0; }
  void twoshot_all_reduce(float* data, size_t n, void* stream) override {
    if (!oneshot_ || n * sizeof(float) > twoshot_max_bytes_)
      throw Error("two-shot all-reduce unavailable for " + std::to_string(n * 4) + " bytes");
    check_alive();
    cuda::twoshot_all_reduce_f32(two_, data, n, cudaStream_t(stream));
  }

  void ll_all_reduce(float* data, size_t n, void* stream) override {
    if (!oneshot_ || n * sizeof(float) > capacity_bytes_)
      throw Error("LL all-reduce unavailable for " + std::to_string(n * 4) + " bytes");
    check_alive();
    cuda::ll_all_reduce_f32(ll_, data, n, cudaStream_t(stream));
  }

  bool residual_all_reduce(const cuda::ResidualAllReduce& op, void* stream) override {
    if (world_ == 1 || !oneshot_ || size_t(op.n) * op.H * sizeof(float) > oneshot_max_bytes_ ||
        !cuda::ll_residual_fits(ll_, op))
      return false;
    check_alive();
    cuda::ll_residual_all_reduce(ll_, op, cudaStream_t(stream));
    return true;
  }

  // NCCL only (the bench compares both paths).
  void nccl_all_reduce(float* data, size_t n, void* stream) override {
    check_alive();
    enqueued(nccl().AllReduce(data, data, n, ncclFloat32, ncclSum, comm_, cudaStream_t(stream)), "all_reduce");
  }
  // One-shot only; n * 4 <= oneshot_max_bytes().
  void oneshot_all_reduce(float* data, size_t n, void* stream) override {
    if (!oneshot_ || n * sizeof(float) > capacity_bytes_)
      throw Error("one-shot all-reduce unavailable for " + std::to_string(n * 4) + " bytes");
    cuda::oneshot_all_reduce_f32(peers_, rank_, world_, data, n, timeout_ns_, cudaStream_t(stream));
  }

  void all_gather(const void* send, void* recv, size_t bytes, void* stream) override {
    check_alive();
    // Small gathers (the vocab-parallel greedy's pairs: 8 bytes a row) on the LL kernel; the
    // choice depends on the size only, so every rank makes the same one.
    if (oneshot_ && bytes % 8 == 0 && bytes <= kLLGatherMaxBytes) {
      cuda::ll_all_gather(ll_, send, recv, bytes, cudaStream_t(stream));
      return;
    }
    enqueued(nccl().AllGather(send, recv, bytes, ncclUint8, comm_, cudaStream_t(stream)), "all_gather");
  }

  // Another rank failed (TpBackend): release this rank from any collective it is blocked in
  // (NCCL's abort returns the kernels and the waits of a non-blocking communicator); every later
  // call throws.
  void abort(const std::string& why) override {
    if (aborted_.exchange(true)) return;
    async_error_ = why;
    failed_ = true;
    raise_abort_flag();
    nccl().CommAbort(comm_);
  }

  void broadcast(void* data, size_t bytes, int root, void* stream) override {
    check_alive();
    enqueued(nccl().Broadcast(data, data, bytes, ncclUint8, root, comm_, cudaStream_t(stream)), "broadcast");
  }

 private:
  // A non-blocking communicator may answer ncclInProgress; the next call must wait for success.
  void enqueued(ncclResult_t r, const char* what) {
    if (r == ncclSuccess) return;
    if (r == ncclInProgress) return wait_ready(what);
    failed_ = true;
    throw Error(std::string("NCCL ") + what + " (rank " + std::to_string(rank_) + "): " + nccl_error(r, comm_));
  }

  void wait_ready(const char* what) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto limit = std::chrono::seconds(timeout_seconds());
    for (;;) {
      ncclResult_t s = ncclSuccess;
      nccl().CommGetAsyncError(comm_, &s);
      if (s == ncclSuccess) return;
      if (s != ncclInProgress) {
        failed_ = true;
        throw Error(std::string("NCCL ") + what + " (rank " + std::to_string(rank_) + "): " + nccl_error(s, comm_));
      }
      if (std::chrono::steady_clock::now() - t0 > limit) {
        failed_ = true;
        throw Error(std::string("NCCL ") + what + " (rank " + std::to_string(rank_) + "): no answer from the peers for " +
                    std::to_string(timeout_seconds()) + " s (GPTOSS_TP_TIMEOUT_S); a rank is gone or stuck");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  void check_alive() {
    if (failed_)
      throw Error("the tensor-parallel group of rank " + std::to_string(rank_) +
                  " has failed (a peer died or NCCL reported an error: " + async_error_ + ")");
  }

  // Polls NCCL's asynchronous error; on a failure aborts the communicator, which makes the
  // kernels stuck in a collective return, so the stream's next synchronize reports the error.
  void watch() {
    while (!stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (failed_) continue;
      ncclResult_t s = ncclSuccess;
      if (nccl().CommGetAsyncError(comm_, &s) != ncclSuccess) continue;
      if (s != ncclSuccess && s != ncclInProgress) {
        if (aborted_.exchange(true)) return;  // abort() got there first
        async_error_ = nccl_error(s, comm_);
        std::fprintf(stderr, "gptoss: rank %d: NCCL error, aborting the group: %s\n", rank_, async_error_.c_str());
        failed_ = true;
        raise_abort_flag();
        nccl().CommAbort(comm_);
        return;
      }
    }
  }

  // Releases this rank's peer-memory kernels from their waits (they trap; peer_sync.cuh).
  void raise_abort_flag() {
    if (abort_flag_) *abort_flag_ = 1;
  }

  // One small all_gather through NCCL at init (host values staged in device memory).
  std::vector<PeerInfo> gather_info(const PeerInfo& mine) {
    cuda::DeviceBuffer buf(sizeof(PeerInfo) * world_);
    auto* slot = buf.get<char>() + sizeof(PeerInfo) * rank_;
    GPTOSS_CUDA_CHECK(cudaMemcpy(slot, &mine, sizeof(PeerInfo), cudaMemcpyHostToDevice));
    all_gather(slot, buf.get(), sizeof(PeerInfo), nullptr);
    GPTOSS_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    std::vector<PeerInfo> all(world_);
    GPTOSS_CUDA_CHECK(cudaMemcpy(all.data(), buf.get(), sizeof(PeerInfo) * world_, cudaMemcpyDeviceToHost));
    return all;
  }

  // Registers this rank's region and maps the peers' (peer access for threads of this process,
  // CUDA IPC for other processes of this host). Every rank takes the same decision: the
  // one-shot path is used only when all of them managed to map all peers.
  void setup_oneshot() {
    // [signals][staging (the staged kernel)][LL receive area]; flags and LL slots start at 0.
    const size_t ll_offset = cuda::kOneShotStagingOffset + (capacity_bytes_ + 255) / 256 * 256;
    const size_t cap_floats = capacity_bytes_ / sizeof(float);
    const size_t two_offset = ll_offset + (cuda::ll_area_bytes(cap_floats, world_) + 255) / 256 * 256;
    const size_t two_floats = twoshot_max_bytes_ / sizeof(float);
    const size_t region_bytes = two_offset + (two_floats ? cuda::twoshot_area_bytes(two_floats, world_) : 0);
    region_.alloc(region_bytes);
    GPTOSS_CUDA_CHECK(cudaMemset(region_.get(), 0, region_bytes));
    ll_state_.alloc(4 * sizeof(uint32_t));  // [LL epoch, LL blocks done, two-shot epoch, two-shot blocks done]
    // The abort flag: host memory the kernels read through the mapping (unified addressing).
    void* flag = nullptr;
    GPTOSS_CUDA_CHECK(cudaHostAlloc(&flag, sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable));
    abort_flag_ = static_cast<volatile uint32_t*>(flag);
    *abort_flag_ = 0;
    GPTOSS_CUDA_CHECK(cudaMemset(ll_state_.get(), 0, 4 * sizeof(uint32_t)));
    GPTOSS_CUDA_CHECK(cudaDeviceSynchronize());
    PeerInfo mine;
    mine.region_bytes = region_bytes;
    mine.oneshot_max = oneshot_max_bytes_;
    mine.twoshot_max = twoshot_max_bytes_;
    mine.host_hash = host_hash();
    mine.pid = uint64_t(getpid());
    mine.region = reinterpret_cast<uint64_t>(region_.get());
    mine.device = device_;
    // Only processes need the handle; where IPC is unavailable the threads' path still works.
    if (cudaIpcGetMemHandle(&mine.ipc, region_.get()) != cudaSuccess) {
      cudaGetLastError();
      mine.ipc = cudaIpcMemHandle_t{};
    }
    auto all = gather_info(mine);
    // Every rank must pick the same path for the same call (a rank on NCCL and one on the LL
    // kernel would wait for each other forever).
    for (const auto& p : all) {
      oneshot_max_bytes_ = std::min<size_t>(oneshot_max_bytes_, p.oneshot_max);
      twoshot_max_bytes_ = std::min<size_t>(twoshot_max_bytes_, p.twoshot_max);
    }

    bool ok = true;
    // One host only, and the same layout everywhere (GPTOSS_ALLREDUCE_ONESHOT_MAX alike).
    for (const auto& p : all) ok = ok && p.host_hash == mine.host_hash && p.region_bytes == mine.region_bytes;
    for (int r = 0; ok && r < world_; ++r) {
      if (r == rank_) { peers_.region[r] = region_.get<char>(); continue; }
      if (all[r].pid == mine.pid) {
        int can = 0;
        cudaDeviceCanAccessPeer(&can, device_, all[r].device);
        if (!can) { ok = false; break; }
        cudaError_t e = cudaDeviceEnablePeerAccess(all[r].device, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
        else if (e != cudaSuccess) { cudaGetLastError(); ok = false; break; }
        peers_.region[r] = reinterpret_cast<char*>(all[r].region);
      } else {
        void* p = nullptr;
        cudaError_t e = cudaIpcOpenMemHandle(&p, all[r].ipc, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess) { cudaGetLastError(); ok = false; break; }
        opened_ipc_.push_back(p);
        peers_.region[r] = static_cast<char*>(p);
      }
    }
    mine.ok = ok ? 1 : 0;
    all = gather_info(mine);
    bool all_ok = true;
    for (const auto& p : all) all_ok = all_ok && p.ok;
    oneshot_ = all_ok;
    for (int r = 0; oneshot_ && r < world_; ++r) ll_.area[r] = peers_.region[r] + ll_offset;
    ll_.own = ll_.area[rank_];
    ll_.slots = (cap_floats + 1) / 2;
    ll_.state = ll_state_.get<uint32_t>();
    ll_.rank = rank_;
    ll_.world = world_;
    ll_.timeout_ns = timeout_ns_;
    ll_.abort_flag = abort_flag_;
    for (int r = 0; oneshot_ && r < world_; ++r) two_.area[r] = peers_.region[r] + two_offset;
    two_.own = two_.area[rank_];
    two_.max_floats = two_floats;
    two_.state = ll_state_.get<uint32_t>() + 2;
    two_.rank = rank_;
    two_.world = world_;
    two_.timeout_ns = timeout_ns_;
    two_.abort_flag = abort_flag_;
    if (!oneshot_ && rank_ == 0)
      std::fprintf(stderr, "gptoss: the GPUs cannot map each other's memory (or span hosts): all-reduce via NCCL only\n");
  }

  int rank_, world_, device_;
  ncclComm_t comm_ = nullptr;
  std::atomic<bool> failed_{false}, aborted_{false}, stop_{false};
  std::string async_error_;
  std::thread watchdog_;
  uint64_t timeout_ns_ = 0;
  static constexpr size_t kLLGatherMaxBytes = 16 * 1024;
  size_t oneshot_max_bytes_ = 0, capacity_bytes_ = 0, twoshot_max_bytes_ = 0;
  bool oneshot_ = false;
  cuda::DeviceBuffer region_, ll_state_;
  cuda::OneShotPeers peers_{};
  cuda::LLPeers ll_{};
  cuda::TwoShotPeers two_{};
  std::vector<void*> opened_ipc_;
  volatile uint32_t* abort_flag_ = nullptr;  // pinned, mapped; freed in the destructor
};

}  // namespace

CommId cuda_new_comm_id() {
  ncclUniqueId uid;
  const ncclResult_t r = nccl().GetUniqueId(&uid);
  if (r != ncclSuccess) throw Error(std::string("ncclGetUniqueId: ") + nccl().GetErrorString(r));
  CommId id{};
  std::memcpy(id.data(), &uid, sizeof(uid));
  return id;
}

std::unique_ptr<Communicator> make_cuda_communicator(const CommId& id, int rank, int world, int device) {
  return std::make_unique<CudaCommunicatorImpl>(id, rank, world, device);
}

}  // namespace gptoss
