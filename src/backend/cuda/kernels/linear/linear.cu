// Linear layers: which kernel runs a dense or grouped (MoE) matrix product, and the entry points
// of kernels.h that run it: cuBLASLt (dense bf16 from cublas_min_rows() rows), the tensor-core
// skinny and stream-K kernels (decode sizes, fragment layouts), the expert GEMMs (prefill MXFP4),
// and our own GEMV (gemv.cu) and mma.sync GEMM (gemm_mma.cu) for the rest.
#include <algorithm>

#include "backend/cuda/cublaslt_gemm.h"
#include "backend/cuda/kernels/linear/linear_common.cuh"

namespace gptoss::cuda {

namespace {

using namespace linear_impl;

int g_force_path = 0;
int g_gemv_variant = 0;  // 0 = best known, 1 = the first GEMV (row pairs), for A/B runs

void check_args(const WeightMat& W, const Epilogue& epi) {
  if (W.K % 32 != 0)
    throw Error("linear: K must be a multiple of 32 (got " + std::to_string(W.K) + ")");
  if (epi.mode == Epilogue::kSwiGLU && W.N % 2 != 0) throw Error("linear: SwiGLU needs an even N");
}

void launch(const LinArgs& a, int path, int grid_y, cudaStream_t s, const FusedNorm& fn = FusedNorm{}) {
  if (path == 1)
    launch_gemv(a, grid_y, s, fn, g_gemv_variant);
  else
    launch_gemm_mma(a, grid_y, s);
}

}  // namespace

int cublas_min_rows() {
  static const int rows = std::max(1, env_int("GPTOSS_CUBLAS_MIN_ROWS", 17));
  return rows;
}

LinearKernel choose_linear_kernel(const LinearProblem& p) {
  const bool frag = p.fmt == WeightMat::kFragBF16 || p.fmt == WeightMat::kFragFP8 || p.fmt == WeightMat::kFragMXFP4;
  if (p.invariant) {
    if (frag) return LinearKernel::kSkinnyMma;
    if (p.fmt == WeightMat::kBF16 && !p.grouped && p.N <= 512) return LinearKernel::kGemvBf16;
    return LinearKernel::kNone;
  }
  // Dense bf16 layers (qkv, o_proj, lm_head; the router past the GEMV's range) from
  // cublas_min_rows() rows on cuBLASLt when offered: ~3x our mma.sync GEMM at prefill sizes, and
  // ahead of the skinny kernels past 16 tokens (bench-kernels prints both).
  if (p.cublas && p.fmt == WeightMat::kBF16 && !p.grouped && p.force_path == 0 && p.rows >= cublas_min_rows())
    return LinearKernel::kCublasLt;
  if (frag) {
    // Decode batches (tokens per group <= 64) ride the tensor-core "skinny" kernels; prefill
    // tiles go to the mma GEMM (which reads the MXFP4 fragment layout directly).
    if (p.force_path != 2 && p.tokens <= kSkinnyMaxTokens) {
      // Tokens one weight matrix sees a pass: dense, all rows; grouped, the mean group (pairs over
      // the experts they can touch), as skinny_linear sizes its n-tiles. One 8-token n-tile: the
      // stream-K kernel (an even share of the chunks for every warp of the GPU).
      const int groups = p.grouped ? std::max(1, std::min(p.rows, p.experts > 0 ? p.experts : p.rows)) : 1;
      const int per_group = p.grouped ? (p.experts > 0 ? (p.rows + groups - 1) / groups : p.tokens) : p.rows;
      if (p.decode_kernel == 0 && per_group <= 8 &&
          streamk_takes(p.fmt, p.N, p.K, p.rows, p.experts > 0 ? p.experts : p.rows, p.grouped, p.rows))
        return LinearKernel::kStreamK;
      return LinearKernel::kSkinnyMma;
    }
    if (p.fmt != WeightMat::kFragMXFP4) return LinearKernel::kNone;
    return LinearKernel::kGemmMma;
  }
  if (p.fmt == WeightMat::kMXFP4 && p.K > kMxMaxK) return LinearKernel::kGemmMma;
  int path = p.force_path;
  if (!path) {
    path = (p.grouped ? p.rows <= 4 * kGemvMaxM : p.rows <= kGemvMaxM) ? 1 : 2;
    // Narrow bf16 matrices (the router) stay on the K-split GEMV for decode batches: the GEMM's
    // 128-column tiles would run them on one or two SMs (bench-kernels, 32 tokens: 30 vs 47 us).
    if (!p.grouped && p.fmt == WeightMat::kBF16 && p.N <= 512 && p.rows <= 64) path = 1;
  }
  if (path == 2) return LinearKernel::kGemmMma;
  return p.fmt == WeightMat::kMXFP4 ? LinearKernel::kGemvMxfp4 : LinearKernel::kGemvBf16;
}

const char* linear_kernel_name(LinearKernel k) {
  switch (k) {
    case LinearKernel::kGemvBf16: return "gemv_bf16";
    case LinearKernel::kGemvMxfp4: return "gemv_mxfp4";
    case LinearKernel::kSkinnyMma: return "skinny_mma";
    case LinearKernel::kStreamK: return "streamk_mma";
    case LinearKernel::kGemmMma: return "gemm_mma";
    case LinearKernel::kCublasLt: return "cublaslt";
    default: return "none";
  }
}

namespace {

LinearKernel pick(const WeightMat& W, int rows, int tokens, bool grouped, bool invariant = false,
                  bool cublas = false, int experts = 0) {
  LinearProblem p{W.fmt, rows, tokens, W.N, W.K, grouped, g_force_path, invariant, cublas, experts,
                  decode_kernel_choice()};
  LinearKernel k = choose_linear_kernel(p);
  if (k == LinearKernel::kNone)
    throw Error("linear: no kernel for this weight format at " + std::to_string(tokens) + " tokens");
  return k;
}

}  // namespace

void set_linear_path(int path) { g_force_path = path; }
void set_gemv_variant(int v) { g_gemv_variant = v; }

void linear(const WeightMat& W, const bf16_t* A, int lda, int M, const Epilogue& epi, cudaStream_t s,
            bool invariant, CublasLtGemm* blas) {
  if (M <= 0) return;
  check_args(W, epi);
  if (epi.mode == Epilogue::kScatterAdd) throw Error("linear: scatter-add needs routing");
  LinArgs a{W, A, lda, M, false, false, MoeRouting{}, epi};
  LinearKernel k = pick(W, M, M, false, invariant, blas && CublasLtGemm::supports(W, lda, epi));
  if (k == LinearKernel::kCublasLt) {
    if (blas->run(W, A, lda, M, epi, s)) return;
    k = pick(W, M, M, false, invariant);  // cuBLASLt has no algorithm for it: our own kernel
  }
  if (k == LinearKernel::kSkinnyMma) {
    // Batch-invariant: 8 warps over K at every M (the shapes chosen by speed differ by M).
    skinny_linear(W, A, false, lda, M, 0, 1, false, false, MoeRouting{}, epi, invariant ? 8 : 0, s);
    return;
  }
  if (k == LinearKernel::kStreamK) {
    streamk_linear(W, A, false, lda, M, 0, 1, false, false, MoeRouting{}, epi, s);
    return;
  }
  const int path = k == LinearKernel::kGemmMma ? 2 : 1;
  launch(a, path, path == 1 ? 1 : (M + kGemmBM - 1) / kGemmBM, s);
}

bool linear_on_cublas(const WeightMat& W, int lda, int M, const Epilogue& epi, bool invariant, CublasLtGemm* blas) {
  return M > 0 && blas && pick(W, M, M, false, invariant, CublasLtGemm::supports(W, lda, epi)) == LinearKernel::kCublasLt;
}

bool linear_router_fold(const WeightMat& W, const bf16_t* A, int lda, int M, const Epilogue& epi,
                        const RouterFold& fold, cudaStream_t s) {
  if (M < 1 || M > kRouterFoldMaxTokens || M != fold.n || !fold.acc || epi.mode != Epilogue::kAddF32) return false;
  check_args(W, epi);
  if (pick(W, M, M, false) != LinearKernel::kSkinnyMma) return false;
  return skinny_router_fold(W, A, lda, epi, fold, s);
}

bool linear_runs_dense_8x2(const WeightMat& W, int M, bool invariant) {
  if (M <= 0 || W.fmt != WeightMat::kFragBF16) return false;
  return pick(W, M, M, false, invariant) == LinearKernel::kSkinnyMma && skinny_dense_8x2(W, M, invariant ? 8 : 0);
}

bool linear_norm_in(const WeightMat& W, const NormIn& in, int M, const Epilogue& epi, cudaStream_t s) {
  if (M != 1) return false;
  check_args(W, epi);
  if (pick(W, M, M, false) != LinearKernel::kSkinnyMma) return false;
  return skinny_norm_in(W, in, epi, s);
}

void linear_rmsnorm(const WeightMat& W, const float* x, const float* norm_w, float eps, int M, bf16_t* xn,
                    bool need_xn, const Epilogue& epi, cudaStream_t s, bool xn_f16, CublasLtGemm* blas) {
  if (M <= 0) return;
  check_args(W, epi);
  if (epi.mode == Epilogue::kScatterAdd) throw Error("linear: scatter-add needs routing");
  if (W.K % 8 != 0) throw Error("linear_rmsnorm: K must be a multiple of 8");
  const LinearKernel k = pick(W, M, M, false);
  if (k == LinearKernel::kGemvBf16 && M <= kGemvMaxM) {
    LinArgs a{W, nullptr, W.K, M, false, false, MoeRouting{}, epi};
    launch(a, 1, 1, s, FusedNorm{x, norm_w, eps, need_xn ? xn : nullptr, xn_f16});
    return;
  }
  if (xn_f16) throw Error("linear_rmsnorm: fp16 normalized rows only from the fused decode GEMV");
  rmsnorm(x, norm_w, M, W.K, eps, nullptr, xn, s);
  linear(W, xn, W.K, M, epi, s, false, blas);
}

namespace {
// Whether a grouped launch that picked kernel k runs an expert GEMM over MXFP4 weights.
bool mx_gemm(LinearKernel k, const WeightMat& W) {
  return k == LinearKernel::kGemmMma && (W.fmt == WeightMat::kMXFP4 || W.fmt == WeightMat::kFragMXFP4);
}
// Whether a grouped launch that picked kernel k runs expert GEMM version 5: MXFP4 on the GEMM
// path, version 5 asked for (or automatic and preferred), and a problem it takes. The one rule
// linear_grouped follows and expert_gemm_v5_runs reports.
bool v5_takes(LinearKernel k, const WeightMat& W, const void* A, int lda, int pairs, int E, int a_rows,
              const Epilogue& epi) {
  if (!mx_gemm(k, W)) return false;
  const int version = expert_gemm_version();
  const bool v5 = version == 5 || (version == kExpertGemmAuto && expert_gemm_v5_preferred(pairs, E));
  return v5 && expert_gemm_v5_supports(W, A, lda, a_rows, epi);
}
}  // namespace

bool expert_gemm_v5_runs(const WeightMat& W, const void* A, int lda, int pairs, int E, bool gather_a,
                         const Epilogue& epi, int tokens, bool invariant) {
  if (pairs <= 0) return false;
  if (tokens <= 0) tokens = pairs;
  return v5_takes(pick(W, pairs, tokens, true, invariant, false, E), W, A, lda, pairs, E, gather_a ? tokens : pairs, epi);
}

void linear_grouped(const WeightMat& W, const void* A, int lda, int pairs, int E, bool gather_a,
                    const MoeRouting& r, const Epilogue& epi, cudaStream_t s, int tokens, bool a_f16,
                    bool invariant, bool a_k_permuted) {
  if (pairs <= 0) return;
  check_args(W, epi);
  if (tokens <= 0) tokens = pairs;
  // Decode batches spread over many experts (few rows each): GEMV or tensor-core skinny kernel
  // per group. Prefill: GEMM tiles.
  const LinearKernel k = pick(W, pairs, tokens, true, invariant, false, E);
  const int a_rows = gather_a ? tokens : pairs;
  const bool v5 = v5_takes(k, W, A, lda, pairs, E, a_rows, epi);
  if ((a_k_permuted || epi.k_permuted) && !v5)
    throw Error("linear_grouped: k-permuted activations or output need expert GEMM version 5 (expert_gemm_v5_runs)");
  if (k == LinearKernel::kSkinnyMma) {
    // Batch-invariant: the K-split order of sums (8 warps) at every size, whichever shape runs.
    skinny_linear(W, A, a_f16, lda, tokens, pairs, E, true, gather_a, r, epi, invariant ? 8 : 0, s);
    return;
  }
  if (k == LinearKernel::kStreamK) {
    streamk_linear(W, A, a_f16, lda, tokens, pairs, E, true, gather_a, r, epi, s);
    return;
  }
  if (a_f16) throw Error("linear_grouped: fp16 activations only on the skinny kernels");
  const bool mx = mx_gemm(k, W);
  // Version 5 (weights as wgmma's register A) where asked for and it takes the problem; version 3
  // (Hopper wgmma) where the GPU and the build have it; version 2 otherwise.
  const int version = expert_gemm_version();
  if (v5) {
    expert_gemm_v5(W, static_cast<const bf16_t*>(A), lda, pairs, E, gather_a, a_k_permuted, r, epi, s, a_rows);
    return;
  }
  if (mx && version >= 3 && expert_gemm_v3_supports(W, A, lda, a_rows, epi)) {
    expert_gemm_v3(W, static_cast<const bf16_t*>(A), lda, pairs, E, gather_a, r, epi, s);
    return;
  }
  if (mx && version >= 2 && expert_gemm_v2_supports(W, A, lda, a_rows, epi)) {
    expert_gemm_v2(W, static_cast<const bf16_t*>(A), lda, pairs, E, gather_a, r, epi, s);
    return;
  }
  LinArgs a{W, static_cast<const uint16_t*>(A), lda, 0, true, gather_a, r, epi};
  const int path = k == LinearKernel::kGemmMma ? 2 : 1;
  launch(a, path, path == 1 ? moe_max_groups(pairs, E) : moe_max_tiles(pairs, E), s);
}

}  // namespace gptoss::cuda
