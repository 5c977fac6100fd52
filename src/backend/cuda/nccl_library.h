#pragma once
// NCCL, loaded at run time (dlopen "libnccl.so.2") the first time a tensor-parallel group is
// made, so the gptoss binary starts on machines without NCCL and single-GPU runs never touch it.
// Only the handful of entry points the CUDA communicator uses; types come from nccl.h.
#include <nccl.h>

namespace gptoss::cuda {

struct NcclLibrary {
  ncclResult_t (*GetVersion)(int*);
  ncclResult_t (*GetUniqueId)(ncclUniqueId*);
  ncclResult_t (*CommInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*);
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*);
  ncclResult_t (*CommAbort)(ncclComm_t);
  ncclResult_t (*CommFinalize)(ncclComm_t);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*Broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  const char* (*GetErrorString)(ncclResult_t);
  const char* (*GetLastError)(ncclComm_t);
  int version = 0;
};

// Loads NCCL once (thread-safe) and pins NCCL_NVLS_ENABLE=0 in the environment first (NVLink
// SHARP / multicast can take a shared host's GPUs out of service). Throws gptoss::Error naming
// LD_LIBRARY_PATH when libnccl.so.2 cannot be found.
const NcclLibrary& nccl();

}  // namespace gptoss::cuda
