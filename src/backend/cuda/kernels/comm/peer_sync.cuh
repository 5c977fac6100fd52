#pragma once
// Device helpers the peer-memory collectives share (ll_allreduce.cu, twoshot_allreduce.cu,
// oneshot_allreduce.cu): system-scope flags and the call epoch kept in device memory (their
// timeouts read device_utils.cuh's global_timer_ns).
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/device_utils.cuh"  // global_timer_ns

namespace gptoss::cuda {

// Flags are written and read at system scope: the peers are other GPUs.
__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Every thread of a call reads the same epoch from state[0] (state[1] counts finished blocks):
// the last block to finish advances it (epoch_end), and the next call starts after this one has
// ended (stream order; kernels read it after pdl_wait). Epochs start at 1 (state zeroed).
__device__ __forceinline__ uint32_t epoch_begin(const uint32_t* state) {
  return *reinterpret_cast<const volatile uint32_t*>(state) + 1;
}
// No fence before the count: every thread's epoch load has been consumed (its stores carry the
// value) before the barrier, and a fence here would wait for the block's remote stores too.
__device__ __forceinline__ void epoch_end(uint32_t* state, uint32_t epoch) {
  __syncthreads();  // every thread of the block has read the epoch
  if (threadIdx.x == 0) {
    const uint32_t total = gridDim.x * gridDim.y * gridDim.z;
    if (atomicAdd(&state[1], 1u) == total - 1) {
      state[1] = 0;
      state[0] = epoch;
    }
  }
}

// A peer that never comes: after `timeout_ns` of waiting, or as soon as the host raised the
// group's abort flag (host memory mapped into the device, set by Communicator::abort: another
// rank failed), say who waited for whom and trap (a launch error at the next synchronize instead
// of a hang). Checked every 1024 spins: a wait that ends in microseconds never reads it.
__device__ __forceinline__ void check_wait(uint32_t& spins, uint64_t t0, uint64_t timeout_ns,
                                           const volatile uint32_t* abort_flag, const char* what, int rank, int peer,
                                           uint32_t epoch) {
  if (++spins % 1024 != 0) return;
  if (abort_flag && *abort_flag) {
    printf("gptoss: %s: rank %d stopped waiting for rank %d (epoch %u): the group was aborted\n", what, rank, peer,
           epoch);
    __trap();
  }
  if (global_timer_ns() - t0 > timeout_ns) {
    printf("gptoss: %s: rank %d waited %.0f s for rank %d (epoch %u); a peer is gone or stuck\n", what, rank,
           timeout_ns * 1e-9, peer, epoch);
    __trap();
  }
}

}  // namespace gptoss::cuda
