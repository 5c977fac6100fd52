#pragma once
// cuBLASLt, loaded at run time (dlopen) the first time a CUDA backend asks for it, so the gptoss
// binary starts on machines without it (the GPU machine may have it only in a Python wheel) and
// our own kernels serve whenever it is absent. Only the entry points the dense GEMM wrapper
// (cublaslt_gemm.h) uses; types come from the toolkit's cublasLt.h, nothing is linked.
#include <cublasLt.h>

#include <string>
#include <vector>

namespace gptoss::cuda {

struct CublasLtLibrary {
  decltype(&cublasLtGetVersion) GetVersion;
  decltype(&cublasLtGetStatusString) GetStatusString;
  decltype(&cublasLtCreate) Create;
  decltype(&cublasLtDestroy) Destroy;
  decltype(&cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&cublasLtMatmulDescDestroy) MatmulDescDestroy;
  decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
  decltype(&cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
  decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&cublasLtMatmul) Matmul;
  size_t version = 0;  // cublasLtGetVersion(): major * 10000 + minor * 100 + patch
  std::string path;    // the file dlopen found
};

// Where to look, in order: $GPTOSS_CUBLASLT alone when set (a file, e.g. a pip wheel's
// .../site-packages/nvidia/cu13/lib/libcublasLt.so.13), else libcublasLt.so.13 then
// libcublasLt.so through the dynamic loader's search (LD_LIBRARY_PATH, ld.so.cache).
std::vector<std::string> cublaslt_candidates();

// Loads the first candidate that opens and binds every entry point; the library's major version
// must be the header's (CUBLAS_VER_MAJOR: the structs and enums we pass are that version's).
// Throws gptoss::Error naming every candidate and why it failed. Never unloads.
CublasLtLibrary load_cublaslt(const std::vector<std::string>& candidates);

// The process's copy, loaded once (thread-safe) from cublaslt_candidates(); null when it cannot
// be loaded, with the reason in *why if given.
const CublasLtLibrary* cublaslt(std::string* why = nullptr);

}  // namespace gptoss::cuda
