#pragma once
// Error checking and small RAII helpers shared by the CUDA backend's host code and tests.
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/error.h"

namespace gptoss::cuda {

// An integer switch from the environment (unset or empty: dflt), for the kernels' bench and
// comparison switches (GPTOSS_SKINNY_OPT, GPTOSS_CUBLAS_MIN_ROWS, ...); callers keep it in a static.
inline int env_int(const char* name, int dflt) {
  const char* e = std::getenv(name);
  return e && *e ? std::atoi(e) : dflt;
}

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
// their grid to the GPU), or fewer while a limit is set.
int sm_count();
// All the device's SMs, whatever the limit.
int sm_count_all();
// For `bench-kernels --sm-limit` only (kernels/misc/sm_blocker.h holds the other SMs): grids sized
// by sm_count() then fit the SMs left. 0 lifts the limit.
void set_sm_count_limit(int n);

// Runs set() once per device for the flag word `done` (a bit a device ordinal): kernel attributes
// (the shared-memory and cluster-size opt-ins) hold per kernel and device, and tensor-parallel
// ranks in one process each drive their own device.
template <class F>
void once_per_device(std::atomic<uint64_t>& done, F&& set) {
  int dev = 0;
  GPTOSS_CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (done.load() & bit) return;
  set();
  done.fetch_or(bit);
}

}  // namespace gptoss::cuda
