// See cublaslt_gemm.h. Row-major out[M, N] = A[M, K] . W[N, K]^T is, in cuBLAS's column-major
// terms, D[N, M] = op(W) . A' with W read as the column-major K x N matrix (ld K) transposed,
// A' the column-major K x M matrix (ld lda) as it is, and D column-major N x M (ld ldo): the
// "TN" layout cuBLASLt serves best. The bias is a per-row vector of D (CUBLASLT_EPILOGUE_BIAS,
// f32 as WeightMat holds it), added to the f32 accumulator before the output is rounded, as our
// own GEMM does. cuBLASLt's bf16-output GEMMs take only a bf16 bias: when every bias value is a
// bf16 (gpt-oss checkpoints store biases in bf16, so the f32 copy is exact) a bf16 copy of it is
// made once and used, the same sum. Otherwise the bf16 store
// is staged: the GEMM writes f32 rows into a workspace, then f32_rows_to_bf16 rounds them once,
// the same result at a little more memory traffic.
#include "backend/cuda/cublaslt_gemm.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <map>
#include <vector>
#include <tuple>

#include "backend/cuda/cublaslt_library.h"
#include "backend/cuda/cuda_common.h"
#include "common/dtype.h"
#include "common/error.h"

namespace gptoss::cuda {
namespace {

// Largest power of two (up to 256) dividing the address: the heuristic must only offer
// algorithms that work at this alignment.
uint32_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al) al /= 2;
  return al;
}

// Everything the algorithm choice depends on. Pointers enter only through their alignment.
// The bias entry: 0 none, 1 f32, 2 f32 with a prepared bf16 copy (prepare_bf16_bias).
using Key = std::tuple<int, int, int, int, int, int, int, uint32_t, uint32_t, uint32_t, uint32_t>;

bool g_force_staging = false;

}  // namespace

void CublasLtGemm::set_force_staging(bool on) { g_force_staging = on; }

struct CublasLtGemm::Impl {
  const CublasLtLibrary& lib;
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer workspace;
  DeviceBuffer staging;  // f32 [M][N] of a staged bf16 store; grows to the largest one seen
  // The same for stores that fit the size reserve_staging asked for (decode passes, which CUDA
  // graphs capture): never reallocated, so a captured call's rows stay valid whatever `staging`
  // grows to later.
  DeviceBuffer fixed_staging;
  struct Plan {
    bool ok = false;
    bool staged = false;  // D is f32 rows in `staging`, rounded to bf16 after
    bool bias_bf16 = false;  // the bias is the bf16 copy (bf16_bias) of W.bias
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  std::map<Key, Plan> plans;
  // bf16 copies of f32 biases whose values are all bf16, made by prepare_bf16_bias for weights
  // that live as long as this object (the backend's layers).
  std::map<const float*, DeviceBuffer> bf16_biases;
  const void* bf16_bias(const float* b) const {
    auto it = bf16_biases.find(b);
    return it == bf16_biases.end() ? nullptr : it->second.get();
  }
  bool warned = false, said_staged = false;

  explicit Impl(const CublasLtLibrary& l) : lib(l) {}
  ~Impl() {
    for (auto& [k, p] : plans) release(p);
    if (handle) lib.Destroy(handle);
  }
  void release(Plan& p) {
    if (p.desc) lib.MatmulDescDestroy(p.desc);
    for (cublasLtMatrixLayout_t l : {p.a, p.b, p.d})
      if (l) lib.MatrixLayoutDestroy(l);
    p = Plan{};
  }
  void check(cublasStatus_t st, const char* what) const {
    if (st != CUBLAS_STATUS_SUCCESS) throw Error(std::string("cuBLASLt: ") + what + ": " + lib.GetStatusString(st));
  }
  // Builds the descriptors and asks the heuristic for the best algorithm; ok false when it has none.
  Plan make_plan(const WeightMat& W, const bf16_t* A, int lda, int M, const Epilogue& epi, bool staged,
                 const void* bias_bf16, const char** why) {
    Plan p;
    p.staged = staged;
    p.bias_bf16 = bias_bf16 != nullptr;
    const bool f32_out = staged || epi.mode != Epilogue::kStoreBF16;
    check(lib.MatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    check(lib.MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "TRANSA");
    check(lib.MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "TRANSB");
    if (W.bias) {
      const cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
      const int32_t bt = bias_bf16 ? CUDA_R_16BF : CUDA_R_32F;
      const void* bp = bias_bf16 ? bias_bf16 : static_cast<const void*>(W.bias);
      check(lib.MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e), "EPILOGUE");
      check(lib.MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt), "BIAS_DATA_TYPE");
      // The heuristic reads the pointer's alignment from it.
      check(lib.MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp), "BIAS_POINTER");
    }
    check(lib.MatrixLayoutCreate(&p.a, CUDA_R_16BF, W.K, W.N, W.K), "layout W");
    check(lib.MatrixLayoutCreate(&p.b, CUDA_R_16BF, W.K, M, lda), "layout A");
    check(lib.MatrixLayoutCreate(&p.d, f32_out ? CUDA_R_32F : CUDA_R_16BF, W.N, M, staged ? W.N : epi.ldo),
          "layout out");
    cublasLtMatmulPreference_t pref = nullptr;
    check(lib.MatmulPreferenceCreate(&pref), "MatmulPreferenceCreate");
    const uint64_t ws = workspace.bytes();
    const uint32_t al_w = alignment(W.w), al_a = alignment(A), al_o = staged ? 256 : alignment(epi.out);
    bool set = lib.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) ==
                   CUBLAS_STATUS_SUCCESS &&
               lib.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_w,
                                                sizeof al_w) == CUBLAS_STATUS_SUCCESS &&
               lib.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_a,
                                                sizeof al_a) == CUBLAS_STATUS_SUCCESS &&
               lib.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_o,
                                                sizeof al_o) == CUBLAS_STATUS_SUCCESS &&
               lib.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_o,
                                                sizeof al_o) == CUBLAS_STATUS_SUCCESS;
    cublasLtMatmulHeuristicResult_t res[4] = {};
    int n = 0;
    const cublasStatus_t st =
        set ? lib.MatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.d, p.d, pref, 4, res, &n) : CUBLAS_STATUS_NOT_SUPPORTED;
    lib.MatmulPreferenceDestroy(pref);
    for (int i = 0; st == CUBLAS_STATUS_SUCCESS && i < n; ++i)
      if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= ws) {
        p.algo = res[i].algo;
        p.ok = true;
        break;
      }
    if (!p.ok) {
      *why = st == CUBLAS_STATUS_SUCCESS ? "no algorithm" : lib.GetStatusString(st);
      release(p);
    }
    return p;
  }
  // Said once per backend: the layer then runs on our own GEMM, correct but slower.
  void decline(const WeightMat& W, int M, const Epilogue& epi, const char* why) {
    if (warned) return;
    warned = true;
    std::fprintf(stderr, "gptoss: cuBLASLt declines a %dx%dx%d GEMM (mode %d, bias %s): %s; own GEMM instead\n", M,
                 W.N, W.K, int(epi.mode), W.bias ? "f32" : "none", why);
  }
};

CublasLtGemm::CublasLtGemm(const CublasLtLibrary& lib) : lib_(lib), impl_(std::make_unique<Impl>(lib)) {
  impl_->check(lib.Create(&impl_->handle), "cublasLtCreate");
  impl_->workspace.alloc(kWorkspaceBytes);
}

CublasLtGemm::~CublasLtGemm() = default;

void CublasLtGemm::reserve_staging(size_t bytes) {
  if (impl_->fixed_staging.bytes() < bytes) impl_->fixed_staging.alloc(bytes);
}

std::string CublasLtGemm::describe() const {
  const size_t v = lib_.version;
  return "cuBLASLt " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100) + " (" + lib_.path + ")";
}

bool CublasLtGemm::prepare_bf16_bias(const float* bias, int n, cudaStream_t s) {
  if (!bias || n <= 0) return false;
  if (impl_->bf16_biases.count(bias)) return true;
  std::vector<float> h(n);
  GPTOSS_CUDA_CHECK(cudaMemcpyAsync(h.data(), bias, size_t(n) * 4, cudaMemcpyDeviceToHost, s));
  GPTOSS_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<uint16_t> hb(n);
  for (int i = 0; i < n; ++i) {
    hb[i] = f32_to_bf16(h[i]);
    if (bf16_to_f32(hb[i]) != h[i]) return false;  // not exact: the staged route keeps the f32 sum
  }
  DeviceBuffer d;
  d.alloc(size_t(n) * 2);
  GPTOSS_CUDA_CHECK(cudaMemcpy(d.get(), hb.data(), size_t(n) * 2, cudaMemcpyHostToDevice));
  impl_->bf16_biases.emplace(bias, std::move(d));
  return true;
}

bool CublasLtGemm::supports(const WeightMat& W, int lda, const Epilogue& epi) {
  if (W.fmt != WeightMat::kBF16 || epi.out_f16) return false;
  if (epi.mode != Epilogue::kStoreBF16 && epi.mode != Epilogue::kStoreF32 && epi.mode != Epilogue::kAddF32) return false;
  // Rows of A, W and the output start on 16-byte boundaries (the tensor-core kernels' loads).
  const int out_elem = epi.mode == Epilogue::kStoreBF16 ? 2 : 4;
  return W.K % 8 == 0 && lda % 8 == 0 && lda >= W.K && (size_t(epi.ldo) * out_elem) % 16 == 0 && epi.ldo >= W.N;
}

bool CublasLtGemm::run(const WeightMat& W, const bf16_t* A, int lda, int M, const Epilogue& epi, cudaStream_t s) {
  if (M <= 0) return true;
  if (!supports(W, lda, epi)) return false;
  const Key key{M,
                W.N,
                W.K,
                lda,
                epi.ldo,
                int(epi.mode),
                W.bias ? (impl_->bf16_bias(W.bias) ? 2 : 1) : 0,
                alignment(W.w),
                alignment(A),
                alignment(epi.out),
                W.bias ? alignment(W.bias) : 0u};
  auto it = impl_->plans.find(key);
  if (it == impl_->plans.end()) {
    const char* why = "";
    Impl::Plan p;
    const bool bf16_out = epi.mode == Epilogue::kStoreBF16;
    if (!g_force_staging || !bf16_out) p = impl_->make_plan(W, A, lda, M, epi, false, nullptr, &why);
    // bf16 output with a bias: the bf16 copy of the bias when it is exact, else staged f32 rows.
    const void* bb = bf16_out && W.bias && !g_force_staging ? impl_->bf16_bias(W.bias) : nullptr;
    if (!p.ok && bb) p = impl_->make_plan(W, A, lda, M, epi, false, bb, &why);
    if (!p.ok && bf16_out) p = impl_->make_plan(W, A, lda, M, epi, true, nullptr, &why);
    if (!p.ok) impl_->decline(W, M, epi, why);
    if (p.ok && p.staged && !g_force_staging && !impl_->said_staged) {
      impl_->said_staged = true;
      std::fprintf(stderr, "gptoss: cuBLASLt has no bf16-output GEMM with an f32 bias here (%s); bf16 outputs go "
                   "through f32 rows\n", why);
    }
    it = impl_->plans.emplace(key, p).first;
  }
  Impl::Plan& p = it->second;
  if (!p.ok) return false;
  void* d = epi.out;
  if (p.staged) {
    const size_t need = size_t(M) * W.N * sizeof(float);
    if (need <= impl_->fixed_staging.bytes()) {
      d = impl_->fixed_staging.get();
    } else {
      if (impl_->staging.bytes() < need) {
        // Work queued on s may still read the old buffer. (Past the reserved size: prefill, never
        // a graph capture.)
        GPTOSS_CUDA_CHECK(cudaStreamSynchronize(s));
        impl_->staging.alloc(need);
      }
      d = impl_->staging.get();
    }
  }
  if (W.bias) {
    const void* bp = p.bias_bf16 ? impl_->bf16_bias(W.bias) : static_cast<const void*>(W.bias);
    impl_->check(lib_.MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp),
                 "BIAS_POINTER");
  }
  const float alpha = 1.f, beta = epi.mode == Epilogue::kAddF32 ? 1.f : 0.f;
  // kAddF32 reads C = the output itself (in place: C and D share pointer and layout).
  const cublasStatus_t st = lib_.Matmul(impl_->handle, p.desc, &alpha, W.w, p.a, A, p.b, &beta, d, p.d, d, p.d,
                                        &p.algo, impl_->workspace.get(), impl_->workspace.bytes(), s);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
    impl_->decline(W, M, epi, lib_.GetStatusString(st));
    impl_->release(p);
    return false;
  }
  impl_->check(st, "cublasLtMatmul");
  if (p.staged) f32_rows_to_bf16(static_cast<const float*>(d), M, W.N, static_cast<bf16_t*>(epi.out), epi.ldo, s);
  return true;
}

std::unique_ptr<CublasLtGemm> make_dense_gemm(const std::string& choice, bool invariant, CublasLtLoader load) {
  std::string c = choice.empty() ? "auto" : choice;
  const char* env = std::getenv("GPTOSS_DENSE_GEMM");
  if (c == "auto" && env && *env) c = env;
  if (c != "auto" && c != "cublas" && c != "own")
    throw Error("--dense-gemm " + c + (c == choice ? "" : " (from GPTOSS_DENSE_GEMM)") +
                ": expected auto, cublas or own");
  if (c == "own") return nullptr;
  if (invariant) {
    if (c == "cublas")
      std::fprintf(stderr, "gptoss: --batch-invariant keeps the dense layers on gptoss's own GEMM, not cuBLASLt\n");
    return nullptr;
  }
  std::string why;
  const CublasLtLibrary* lib = (load ? load : cublaslt)(&why);
  if (!lib) {
    if (c == "cublas") std::fprintf(stderr, "gptoss: --dense-gemm cublas: %s; gptoss's own GEMM instead\n", why.c_str());
    return nullptr;
  }
  auto g = std::make_unique<CublasLtGemm>(*lib);
  static std::once_flag said;
  std::call_once(said, [&] {
    std::fprintf(stderr, "gptoss: dense GEMMs (qkv, o_proj, lm_head from 17 tokens; the router at prefill) on %s\n", g->describe().c_str());
  });
  return g;
}

}  // namespace gptoss::cuda
