// Host helpers of cuda_common.h: error reporting, device buffers, device presence.
#include <cooperative_groups.h>

#include <atomic>
#include <cstdio>
#include <string>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/kv_layout.h"

namespace gptoss::cuda {

void throw_cuda_error(cudaError_t e, const char* what, const char* file, int line) {
  throw Error(std::string("CUDA error ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ") in " + what +
              " at " + file + ":" + std::to_string(line));
}

void DeviceBuffer::alloc(size_t bytes) {
  reset();
  if (bytes == 0) return;
  cudaError_t e = cudaMalloc(&p_, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    p_ = nullptr;
    throw Error("cudaMalloc of " + std::to_string(bytes) + " bytes failed: " + cudaGetErrorString(e));
  }
  n_ = bytes;
}

void DeviceBuffer::reset() {
  if (p_) cudaFree(p_);
  p_ = nullptr;
  n_ = 0;
}

bool cuda_device_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

namespace {
std::atomic<int> g_sm_count_limit{0};
}

int sm_count_all() {
  static std::atomic<int> sms[64];  // by device ordinal; TP ranks in one process each have theirs
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64) dev = 0;
  int n = sms[dev].load(std::memory_order_relaxed);
  if (!n) {
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    if (n <= 0) n = 132;
    sms[dev].store(n, std::memory_order_relaxed);
  }
  return n;
}

int sm_count() {
  const int n = sm_count_all(), limit = g_sm_count_limit.load(std::memory_order_relaxed);
  return limit > 0 && limit < n ? limit : n;
}

void set_sm_count_limit(int n) { g_sm_count_limit.store(n, std::memory_order_relaxed); }

bool pdl_launches_enabled() {
  static const bool on = env_int("GPTOSS_PDL", 1) != 0;
  return on;
}

}  // namespace gptoss::cuda
