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

enum class Path { kNccl, kOneShot, kAuto };

// Microseconds per all-reduce of `n` floats on `path` (rank 0's figure; -1 when unavailable).
double time_path(CudaCommunicator& comm, Path path, float* data, size_t n, const AllReduceBenchOptions& o,
                 cudaStream_t stream) {
  if (path == Path::kOneShot && n * 4 > comm.oneshot_max_bytes()) return -1;
  auto call = [&] {
    if (path == Path::kNccl) comm.nccl_all_reduce(data, n, stream);
    else if (path == Path::kOneShot) comm.oneshot_all_reduce(data, n, stream);
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
  const std::vector<size_t> bytes = {5760, 11520, 23040, 46080, 92160, 184320, 368640,
                                     524288, 1 << 20, 2 << 20, 4 << 20, 16 << 20};
  const CommId id = cuda_new_comm_id();
  std::vector<std::vector<double>> table(bytes.size(), std::vector<double>(3, -1));
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
        DeviceBuffer data(bytes.back());
        GPTOSS_CUDA_CHECK(cudaMemset(data.get(), 0, bytes.back()));
        for (size_t s = 0; s < bytes.size(); ++s)
          for (Path p : {Path::kNccl, Path::kOneShot, Path::kAuto}) {
            const double us = time_path(comm, p, data.get<float>(), bytes[s] / 4, o, stream);
            if (rank == 0) table[s][int(p)] = us;
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
  std::printf("| bytes | NCCL | one-shot | all_reduce_sum (auto) |\n|---:|---:|---:|---:|\n");
  for (size_t s = 0; s < bytes.size(); ++s) {
    auto cell = [](double v) { return v < 0 ? std::string("-") : std::to_string(v).substr(0, 6); };
    std::printf("| %zu | %s | %s | %s |\n", bytes[s], cell(table[s][0]).c_str(), cell(table[s][1]).c_str(),
                cell(table[s][2]).c_str());
  }
  return 0;
}

}  // namespace gptoss::cuda
