#include "backend/cuda/nccl_library.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "common/error.h"

namespace gptoss::cuda {
namespace {

void pin_nvls_off() {
  const char* v = std::getenv("NCCL_NVLS_ENABLE");
  if (v && std::strcmp(v, "0") != 0)
    std::fprintf(stderr, "gptoss: NCCL_NVLS_ENABLE=%s ignored: NVLink SHARP/multicast stays off\n", v);
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  // Connect every channel at init rather than at a collective's first use, which may be inside
  // a CUDA graph capture (unless the user chose otherwise).
  setenv("NCCL_RUNTIME_CONNECT", "0", 0);
}

template <class F>
void bind(void* lib, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn) throw Error(std::string("libnccl.so.2 lacks ") + name + " (NCCL >= 2.18 is needed)");
}

NcclLibrary load() {
  pin_nvls_off();
  void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    const char* why = dlerror();
    throw Error(std::string("tensor parallelism on CUDA needs NCCL: cannot load libnccl.so.2 (") +
                (why ? why : "not found") +
                "); install NCCL or add its lib directory to LD_LIBRARY_PATH (e.g. the pip wheel's "
                ".../site-packages/nvidia/nccl/lib)");
  }
  NcclLibrary l{};
  bind(lib, l.GetVersion, "ncclGetVersion");
  bind(lib, l.GetUniqueId, "ncclGetUniqueId");
  bind(lib, l.CommInitRankConfig, "ncclCommInitRankConfig");
  bind(lib, l.CommGetAsyncError, "ncclCommGetAsyncError");
  bind(lib, l.CommAbort, "ncclCommAbort");
  bind(lib, l.CommFinalize, "ncclCommFinalize");
  bind(lib, l.CommDestroy, "ncclCommDestroy");
  bind(lib, l.AllReduce, "ncclAllReduce");
  bind(lib, l.AllGather, "ncclAllGather");
  bind(lib, l.Broadcast, "ncclBroadcast");
  bind(lib, l.GetErrorString, "ncclGetErrorString");
  bind(lib, l.GetLastError, "ncclGetLastError");
  l.GetVersion(&l.version);
  // ncclConfig_t grows with the minor version: a library older than the header would misread it.
  if (l.version < NCCL_VERSION(2, 18, 0))
    throw Error("libnccl.so.2 is version " + std::to_string(l.version) + "; gptoss needs NCCL >= 2.18");
  return l;
}

}  // namespace

const NcclLibrary& nccl() {
  static std::once_flag once;
  static NcclLibrary lib;
  static std::string error;
  std::call_once(once, [] {
    try {
      lib = load();
    } catch (const Error& e) {
      error = e.what();
    }
  });
  if (!error.empty()) throw Error(error);
  return lib;
}

}  // namespace gptoss::cuda
