#pragma once
// Holds some of the GPU's SMs with idle blocks so that a timed kernel runs on the rest: a way to
// ask, on a card with less memory bandwidth, how a kernel behaves at the bandwidth per SM of a
// bigger one (an H100's 3.35 TB/s over 96 of its 132 SMs asks of each SM what an H200's 4.8 TB/s
// over all 132 does). For `bench-kernels --sm-limit`, nothing in the model uses it.
//
// Each blocker block takes a whole SM (the SM's whole register file and shared memory, so no other
// block fits beside it), says it is resident, and sleeps until released (or for at most ten
// seconds, so that a host call that waits for the whole device, say cudaFree, only stalls).
#include <cuda_runtime.h>

namespace gptoss::cuda {

class SmBlocker {
 public:
  // Occupies `sms` SMs (0: none) until destroyed; returns once all its blocks are resident.
  explicit SmBlocker(int sms);
  ~SmBlocker();
  SmBlocker(const SmBlocker&) = delete;
  SmBlocker& operator=(const SmBlocker&) = delete;

 private:
  int sms_ = 0;
  cudaStream_t stream_ = nullptr;
  volatile int* flags_ = nullptr;  // mapped host memory: [0] release, [1 + b] block b resident
};

}  // namespace gptoss::cuda
