#pragma once
// Dense GEMMs (qkv, o_proj, lm_head; the router at prefill sizes) through cuBLASLt: out = A . W^T
// + bias with the epilogues the model uses on bf16 row-major weights (kernels.h's WeightMat
// kBF16, Epilogue kStoreBF16 / kStoreF32 / kAddF32). One per backend: a handle, a workspace and
// the heuristic's algorithm per problem, all used on the caller's stream. linear() runs it when
// choose_linear_kernel() picks LinearKernel::kCublasLt (bf16 weights, cublas_min_rows() rows or
// more: prefill, and decode passes of 17-64 tokens; not batch-invariant); it declines problems it
// cannot do exactly, and linear() then runs our own GEMM.
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "backend/cuda/kernels.h"

namespace gptoss::cuda {

struct CublasLtLibrary;

class CublasLtGemm {
 public:
  // On the current device: a cuBLASLt handle and a workspace of kWorkspaceBytes.
  explicit CublasLtGemm(const CublasLtLibrary& lib);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // NVIDIA's advice for Hopper

  // Whether the problem is of a kind run() takes (format, epilogue, 16-byte aligned rows); run()
  // may still decline it when cuBLASLt offers no algorithm.
  static bool supports(const WeightMat& W, int lda, const Epilogue& epi);
  // Launches the GEMM on s; false when cuBLASLt has no algorithm for it (remembered per problem)
  // and nothing was launched. Graph-capturable (no allocation, no sync) once a problem's plan
  // exists; plans are made on a problem's first call (host-side heuristic query only).
  bool run(const WeightMat& W, const bf16_t* A, int lda, int M, const Epilogue& epi, cudaStream_t s);

  // cuBLASLt's bf16-output GEMMs take a bf16 bias only: for a bias that lives as long as this
  // object and whose values are all bf16 (checkpoints store biases in bf16), keeps a bf16 copy so
  // bf16 stores with it need no staging. False (and nothing kept) when a value is not a bf16.
  bool prepare_bf16_bias(const float* bias, int n, cudaStream_t s);

  // Tests: every bf16 store takes the staged route (f32 rows, then rounded; see the .cpp) for
  // problems first seen while set.
  static void set_force_staging(bool on);
  // Reserves the staged route's f32 rows for bf16 outputs of up to `bytes` in a buffer of their
  // own that never moves: larger stores grow another buffer (a stream sync and an allocation,
  // which a CUDA graph capture must not meet, and which would leave a captured call's pointer
  // dangling). The backend reserves its decode passes' size.
  void reserve_staging(size_t bytes);

  const CublasLtLibrary& library() const { return lib_; }
  // "cuBLASLt 13.0.2 (/path/libcublasLt.so.13)", for start-up lines and bench-kernels.
  std::string describe() const;

 private:
  struct Impl;
  const CublasLtLibrary& lib_;
  std::unique_ptr<Impl> impl_;
};

// The backend's cuBLASLt GEMM for `--dense-gemm` (BackendOptions::dense_gemm): auto (yields to
// GPTOSS_DENSE_GEMM when that is set), cublas or own; null means our own kernels: "own",
// batch-invariant mode, or a library that does not load (said on stderr only when cublas was
// asked for). The first one made in the process says on stderr which library file serves.
// Throws gptoss::Error on another choice. On the current device. load: how the library is found
// (tests pass one that finds none).
using CublasLtLoader = const CublasLtLibrary* (*)(std::string* why);
std::unique_ptr<CublasLtGemm> make_dense_gemm(const std::string& choice, bool invariant,
                                              CublasLtLoader load = nullptr);

}  // namespace gptoss::cuda
