#pragma once
// Error checking and small RAII helpers shared by the CUDA backend's host code and tests.
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "common/error.h"

namespace gptoss::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t e, const char* what, const char* file, int line);

#define GPTOSS_CUDA_CHECK(expr)                                                      \
  do {                                                                               \
    cudaError_t _e = (expr);                                                         \
    if (_e != cudaSuccess) ::gptoss::cuda::throw_cuda_error(_e, #expr, __FILE__, __LINE__); \
  } while (0)

// Checked after every launch: catches bad configurations at once (execution errors surface at
// the next synchronizing call, which is checked too).
#define GPTOSS_CUDA_LAUNCH_CHECK() GPTOSS_CUDA_CHECK(cudaGetLastError())

// Owning device allocation (cudaMalloc; never managed memory).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { alloc(bytes); }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) { reset(); p_ = o.p_; n_ = o.n_; o.p_ = nullptr; o.n_ = 0; }
    return *this;
  }
  void alloc(size_t bytes);
  void reset();
  template <class T = void>
  T* get() const { return static_cast<T*>(p_); }
  size_t bytes() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// True when a CUDA device is usable (tests skip otherwise).
bool cuda_device_available();

// Streaming multiprocessors of the current device (read once per device; kernels that size
// their grid to the GPU).
int sm_count();

}  // namespace gptoss::cuda
