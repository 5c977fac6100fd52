#include "backend/cuda/cublaslt_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "common/error.h"

namespace gptoss::cuda {
namespace {

template <class F>
bool bind(void* lib, F& fn, const char* name, std::string* why) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn) *why = std::string("lacks ") + name;
  return fn != nullptr;
}

// Opens one candidate; on failure says why in *why and returns false.
bool try_load(const std::string& file, CublasLtLibrary* l, std::string* why) {
  void* lib = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    *why = e ? e : "not found";
    return false;
  }
  bool ok = bind(lib, l->GetVersion, "cublasLtGetVersion", why) &&
            bind(lib, l->GetStatusString, "cublasLtGetStatusString", why) &&
            bind(lib, l->Create, "cublasLtCreate", why) && bind(lib, l->Destroy, "cublasLtDestroy", why) &&
            bind(lib, l->MatmulDescCreate, "cublasLtMatmulDescCreate", why) &&
            bind(lib, l->MatmulDescDestroy, "cublasLtMatmulDescDestroy", why) &&
            bind(lib, l->MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute", why) &&
            bind(lib, l->MatrixLayoutCreate, "cublasLtMatrixLayoutCreate", why) &&
            bind(lib, l->MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy", why) &&
            bind(lib, l->MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate", why) &&
            bind(lib, l->MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy", why) &&
            bind(lib, l->MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute", why) &&
            bind(lib, l->MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic", why) &&
            bind(lib, l->Matmul, "cublasLtMatmul", why);
  if (ok) {
    l->version = l->GetVersion();
    if (l->version / 10000 != CUBLAS_VER_MAJOR) {
      *why = "is version " + std::to_string(l->version) + "; gptoss was built against cuBLAS " +
             std::to_string(CUBLAS_VER_MAJOR) + ".x";
      ok = false;
    }
  }
  if (!ok) {
    dlclose(lib);
    return false;
  }
  // The file the loader picked (a bare soname says little when LD_LIBRARY_PATH is involved).
  Dl_info info{};
  l->path = dladdr(reinterpret_cast<void*>(l->Create), &info) && info.dli_fname ? info.dli_fname : file;
  return true;
}

}  // namespace

std::vector<std::string> cublaslt_candidates() {
  if (const char* f = std::getenv("GPTOSS_CUBLASLT"); f && *f) return {f};
  return {"libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR), "libcublasLt.so"};
}

CublasLtLibrary load_cublaslt(const std::vector<std::string>& candidates) {
  std::string tried;
  for (const std::string& c : candidates) {
    CublasLtLibrary l{};
    std::string why;
    if (try_load(c, &l, &why)) return l;
    tried += (tried.empty() ? "" : "; ") + c + ": " + why;
  }
  throw Error("cannot load cuBLASLt (" + (tried.empty() ? std::string("no candidate") : tried) +
              "); add its lib directory to LD_LIBRARY_PATH or name the file in GPTOSS_CUBLASLT (e.g. the pip "
              "wheel's .../site-packages/nvidia/cu13/lib/libcublasLt.so.13)");
}

const CublasLtLibrary* cublaslt(std::string* why) {
  static std::once_flag once;
  static CublasLtLibrary lib;
  static std::string error;
  std::call_once(once, [] {
    try {
      lib = load_cublaslt(cublaslt_candidates());
    } catch (const Error& e) {
      error = e.what();
    }
  });
  if (!error.empty()) {
    if (why) *why = error;
    return nullptr;
  }
  return &lib;
}

}  // namespace gptoss::cuda
