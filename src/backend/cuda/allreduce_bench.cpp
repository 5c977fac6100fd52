#include "backend/cuda/allreduce_bench.h"

#include <algorithm>
#include <barrier>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_communicator.h"
#include "common/error.h"

namespace gptoss::cuda {
namespace {

enum class Path { kNccl, kLL, kStaged, kRowsNorm, kTwoShot, kAuto, kCount };
constexpr int kRowH = 2880;  // gpt-oss hidden size: the residual rows of decode

// Microseconds per all-reduce of `n` floats on `path` (rank 0's figure; -1 when unavailable).
// kRowsNorm: n / 2880 rows of the residual all-reduce with the RMSNorm fused (norm weights and
// the normalized rows in `aux`).
double time_path(CudaCommunicator& comm, Path path, float* data, size_t n, float* aux, const AllReduceBenchOptions& o,
                 cudaStream_t stream) {
  const bool peer = path == Path::kLL || path == Path::kStaged || path == Path::kRowsNorm;
  if (peer && n * 4 > comm.peer_capacity_bytes()) return -1;
  if (path == Path::kTwoShot && n * 4 > comm.twoshot_max_bytes()) return -1;
  ResidualAllReduce rows{data, int(n / kRowH), kRowH, true, nullptr, {}, 0, aux, 1e-5f,
                         reinterpret_cast<bf16_t*>(aux + kRowH)};
  if (path == Path::kRowsNorm && (n % kRowH != 0 || n * 4 > comm.oneshot_max_bytes() ||
                                  !comm.residual_all_reduce(rows, stream)))  // the warm-up call
    return -1;
  auto call = [&] {
    if (path == Path::kNccl) comm.nccl_all_reduce(data, n, stream);
    else if (path == Path::kLL) comm.ll_all_reduce(data, n, stream);
    else if (path == Path::kStaged) comm.oneshot_all_reduce(data, n, stream);
    else if (path == Path::kRowsNorm) comm.residual_all_reduce(rows, stream);
    else if (path == Path::kTwoShot) comm.twoshot_all_reduce(data, n, stream);
    else comm.all_reduce_sum(data, n, stream);
  };
  call();  // warm up outside the graph
  GPTOSS_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  GPTOSS_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < o.iters; ++i) call();
  GPTOSS_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  GPTOSS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t a, b;
  GPTOSS_CUDA_CHECK(cudaEventCreate(&a));
  GPTOSS_CUDA_CHECK(cudaEventCreate(&b));
  GPTOSS_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  GPTOSS_CUDA_CHECK(cudaStreamSynchronize(stream));
  float best = 1e30f;
  for (int r = 0; r < o.reps; ++r) {
    GPTOSS_CUDA_CHECK(cudaEventRecord(a, stream));
    GPTOSS_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    GPTOSS_CUDA_CHECK(cudaEventRecord(b, stream));
    GPTOSS_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    GPTOSS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    best = std::min(best, ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return best * 1000.0 / o.iters;
}

}  // namespace

int run_allreduce_bench(const AllReduceBenchOptions& o) {
  int ngpu = 0;
  if (cudaGetDeviceCount(&ngpu) != cudaSuccess) ngpu = 0;
  if (o.tp < 2 || o.first_device + o.tp > ngpu) {
    std::fprintf(stderr, "bench-allreduce: --gpus %d from GPU %d needs that many GPUs (found %d)\n", o.tp,
                 o.first_device, ngpu);
    return 1;
  }
  // Decode's residual rows (2880 floats = 11.5 KB each) from 1 to 64 rows, a few sizes between,
  // and the prefill sizes NCCL serves.
  const std::vector<size_t> bytes = {5760,   11520,  23040,   46080,   92160,   184320,  368640,  524288,
                                     737280, 1 << 20, 2 << 20, 4 << 20, 16 << 20, 23592960 /* 2048 rows */};
  const CommId id = cuda_new_comm_id();
  std::vector<std::vector<double>> table(bytes.size(), std::vector<double>(int(Path::kCount), -1));
  std::mutex err_mu;
  std::string err;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < o.tp; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        const int dev = o.first_device + rank;
        auto base = make_cuda_communicator(id, rank, o.tp, dev);
        auto& comm = dynamic_cast<CudaCommunicator&>(*base);
        GPTOSS_CUDA_CHECK(cudaSetDevice(dev));
        cudaStream_t stream;
        GPTOSS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        DeviceBuffer data(bytes.back()), aux(kRowH * 4 + 64 * kRowH * 2);
        GPTOSS_CUDA_CHECK(cudaMemset(data.get(), 0, bytes.back()));
        GPTOSS_CUDA_CHECK(cudaMemset(aux.get(), 0, aux.bytes()));
        for (size_t s = 0; s < bytes.size(); ++s)
          for (int p = 0; p < int(Path::kCount); ++p) {
            const double us = time_path(comm, Path(p), data.get<float>(), bytes[s] / 4, aux.get<float>(), o, stream);
            if (rank == 0) table[s][p] = us;
          }
        GPTOSS_CUDA_CHECK(cudaStreamDestroy(stream));
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> l(err_mu);
        err += "rank " + std::to_string(rank) + ": " + e.what() + "\n";
      }
    });
  }
  for (auto& t : threads) t.join();
  if (!err.empty()) {
    std::fprintf(stderr, "bench-allreduce: %s", err.c_str());
    return 1;
  }
  std::printf("all-reduce fp32, %d GPUs (from %d), us per call, graph of %d calls, best of %d\n\n", o.tp,
              o.first_device, o.iters, o.reps);
  std::printf("| bytes | NCCL | LL | staged one-shot | LL rows of 2880 + RMSNorm | two-shot | all_reduce_sum (auto) |\n"
              "|---:|---:|---:|---:|---:|---:|---:|\n");
  for (size_t s = 0; s < bytes.size(); ++s) {
    auto cell = [](double v) { return v < 0 ? std::string("-") : std::to_string(v).substr(0, 6); };
    std::printf("| %zu", bytes[s]);
    for (int p = 0; p < int(Path::kCount); ++p) std::printf(" | %s", cell(table[s][p]).c_str());
    std::printf(" |\n");
  }
  return 0;
}

}  // namespace gptoss::cuda
