// See kernel_bench.h: the dense GEMMs on our mma.sync GEMM against cuBLASLt.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cublaslt_gemm.h"
#include "backend/cuda/cublaslt_library.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/kernel_bench.h"
#include "backend/cuda/kernels.h"
#include "common/dtype.h"
#include "model/config.h"

namespace gptoss::cuda {
namespace {

constexpr size_t kRotateBytes = size_t(256) << 20;  // weights rotated over copies past the L2

// Output elements as floats (bf16 or f32 storage).
std::vector<float> download(const void* p, size_t n, bool bf16) {
  std::vector<float> h(n);
  if (bf16) {
    std::vector<uint16_t> b(n);
    GPTOSS_CUDA_CHECK(cudaMemcpy(b.data(), p, n * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; ++i) h[i] = bf16_to_f32(b[i]);
  } else {
    GPTOSS_CUDA_CHECK(cudaMemcpy(h.data(), p, n * 4, cudaMemcpyDeviceToHost));
  }
  return h;
}

// Mean microseconds a call of f(i) over iters calls, after 5 warm-up calls, between ev[0] and ev[1].
template <typename F>
double mean_us(cudaEvent_t (&ev)[2], cudaStream_t s, int iters, F&& f) {
  for (int i = 0; i < 5; ++i) f(i);
  GPTOSS_CUDA_CHECK(cudaEventRecord(ev[0], s));
  for (int i = 0; i < iters; ++i) f(i);
  GPTOSS_CUDA_CHECK(cudaEventRecord(ev[1], s));
  GPTOSS_CUDA_CHECK(cudaEventSynchronize(ev[1]));
  float ms = 0;
  GPTOSS_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
  return 1000.0 * ms / iters;
}

// Random e4m3 codes of magnitude 2^-9 .. 2^-3 (exponent fields 6-12, either sign): finite, and
// the size of 0.02-scale weights or of activations after a per-row scale.
std::vector<uint8_t> random_e4m3(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<uint8_t> v(n);
  for (auto& x : v) {
    const uint32_t r = g();
    x = uint8_t((r & 0x80u) | ((6u + (r >> 8) % 7u) << 3) | ((r >> 16) & 7u));
  }
  return v;
}

// What an fp8 dense path at decode sizes would buy (issue 14's 17-64-token dense layers, which run
// on cuBLASLt over the bf16 weights whatever --dense-dtype says): cuBLASLt's e4m3 x e4m3 GEMM with
// a scale a weight row and a scale a token (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F), no bias,
// timed over weight copies rotated past the L2 as the table above. A probe: nothing in the model
// runs it yet. Prints "no algorithm" where this cuBLASLt and GPU offer none.
void bench_fp8_outer_vec(const CublasLtLibrary& lib, int M, int N, int K, const char* name, bool f32_out, int iters,
                         cudaEvent_t (&ev)[2], cudaStream_t s) {
  cublasLtHandle_t h = nullptr;
  if (lib.Create(&h) != CUBLAS_STATUS_SUCCESS) return;
  std::vector<DeviceBuffer> owned;
  const size_t wbytes = size_t(N) * K;
  const int copies = int(std::max<size_t>(1, (kRotateBytes + wbytes - 1) / wbytes));
  std::vector<void*> ws;
  for (int i = 0; i < copies; ++i) {
    owned.emplace_back(wbytes);
    const std::vector<uint8_t> w = random_e4m3(wbytes, 700 + i);
    GPTOSS_CUDA_CHECK(cudaMemcpy(owned.back().get(), w.data(), wbytes, cudaMemcpyHostToDevice));
    ws.push_back(owned.back().get());
  }
  DeviceBuffer a(size_t(M) * K), sw(size_t(N) * 4), sa(size_t(M) * 4), out(size_t(M) * N * 4);
  DeviceBuffer work(CublasLtGemm::kWorkspaceBytes);
  const std::vector<uint8_t> ah = random_e4m3(size_t(M) * K, 900);
  GPTOSS_CUDA_CHECK(cudaMemcpy(a.get(), ah.data(), ah.size(), cudaMemcpyHostToDevice));
  const std::vector<float> ones_n(N, 1.f), ones_m(M, 1.f);
  GPTOSS_CUDA_CHECK(cudaMemcpy(sw.get(), ones_n.data(), size_t(N) * 4, cudaMemcpyHostToDevice));
  GPTOSS_CUDA_CHECK(cudaMemcpy(sa.get(), ones_m.data(), size_t(M) * 4, cudaMemcpyHostToDevice));
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  const void* swp = sw.get();
  const void* sap = sa.get();
  const uint64_t wsb = work.bytes();
  bool ok = lib.MatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
            lib.MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS &&
            lib.MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == CUBLAS_STATUS_SUCCESS &&
            lib.MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode) ==
                CUBLAS_STATUS_SUCCESS &&
            lib.MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode) ==
                CUBLAS_STATUS_SUCCESS &&
            lib.MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &swp, sizeof swp) ==
                CUBLAS_STATUS_SUCCESS &&
            lib.MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sap, sizeof sap) ==
                CUBLAS_STATUS_SUCCESS &&
            lib.MatrixLayoutCreate(&la, CUDA_R_8F_E4M3, K, N, K) == CUBLAS_STATUS_SUCCESS &&
            lib.MatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, K, M, K) == CUBLAS_STATUS_SUCCESS &&
            lib.MatrixLayoutCreate(&ld, f32_out ? CUDA_R_32F : CUDA_R_16BF, N, M, N) == CUBLAS_STATUS_SUCCESS &&
            lib.MatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
            lib.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb) ==
                CUBLAS_STATUS_SUCCESS;
  cublasLtMatmulHeuristicResult_t res[1] = {};
  int n = 0;
  cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED;
  if (ok) st = lib.MatmulAlgoGetHeuristic(h, desc, la, lb, ld, ld, pref, 1, res, &n);
  const char* out_name = f32_out ? "f32 store" : "bf16 store";
  if (!ok || st != CUBLAS_STATUS_SUCCESS || n == 0) {
    std::printf("| %s | %dx%dx%d | %s | cublaslt fp8 outer-vector: no algorithm (%s) | | |\n", name, M, N, K, out_name,
                ok ? lib.GetStatusString(st) : "descriptor refused");
  } else {
    const float alpha = 1.f, beta = 0.f;
    auto call = [&](int i) {
      return lib.Matmul(h, desc, &alpha, ws[i % copies], la, a.get(), lb, &beta, out.get(), ld, out.get(), ld,
                        &res[0].algo, work.get(), wsb, s);
    };
    st = call(0);
    const double us = mean_us(ev, s, iters, [&](int i) {
      if (st == CUBLAS_STATUS_SUCCESS) st = call(i);  // (after a failure: nothing more to time)
    });
    if (st != CUBLAS_STATUS_SUCCESS)
      std::printf("| %s | %dx%dx%d | %s | cublaslt fp8 outer-vector: %s | | |\n", name, M, N, K, out_name,
                  lib.GetStatusString(st));
    else
      std::printf("| %s | %dx%dx%d | %s | cublaslt fp8 outer-vector | %.2f | %.2f |\n", name, M, N, K, out_name, us,
                  double(wbytes) / us / 1e6);
  }
  std::fflush(stdout);
  if (pref) lib.MatmulPreferenceDestroy(pref);
  for (cublasLtMatrixLayout_t l : {la, lb, ld})
    if (l) lib.MatrixLayoutDestroy(l);
  if (desc) lib.MatmulDescDestroy(desc);
  lib.Destroy(h);
}

}  // namespace

void bench_prefill_dense(const GptOssConfig& c, int M, int iters) {
  if (M < 16) return;
  std::string why;
  const CublasLtLibrary* lib = cublaslt(&why);
  std::unique_ptr<CublasLtGemm> blas;
  if (lib) blas = std::make_unique<CublasLtGemm>(*lib);
  std::printf("\nDense GEMMs at %d tokens: gptoss's mma.sync GEMM against %s\n\n", M,
              blas ? blas->describe().c_str() : ("no cuBLASLt: " + why).c_str());
  std::printf("| layer | MxNxK | epilogue | kernel | us/launch | TFLOP/s | rel. diff to own |\n|---|---|---|---|---|---|---|\n");
  cudaStream_t s;
  GPTOSS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t ev[2];
  for (auto& e : ev) GPTOSS_CUDA_CHECK(cudaEventCreate(&e));
  const int QKV = c.q_dim() + 2 * c.kv_dim();
  struct Layer {
    const char* name;
    int N, K;
    Epilogue::Mode mode;
    const char* epi;
    bool bias;  // as the model runs it: lm_head has none
  };
  const Layer layers[] = {{"qkv", QKV, c.hidden, Epilogue::kStoreBF16, "bf16 store + bias", true},
                          {"o_proj", c.hidden, c.q_dim(), Epilogue::kAddF32, "f32 residual add + bias", true},
                          {"router", c.num_experts, c.hidden, Epilogue::kStoreF32, "f32 store + bias", true},
                          {"lm_head", c.vocab, c.hidden, Epilogue::kStoreF32, "f32 store", false}};
  for (const Layer& l : layers) {
    std::vector<DeviceBuffer> owned;
    auto alloc = [&](size_t bytes) {
      owned.emplace_back(bytes);
      return owned.back().get();
    };
    const size_t wbytes = size_t(l.N) * l.K * 2;
    const int copies = int(std::max<size_t>(1, (kRotateBytes + wbytes - 1) / wbytes));
    std::vector<WeightMat> ws;
    for (int i = 0; i < copies; ++i) {
      auto* w = static_cast<bf16_t*>(alloc(wbytes));
      auto* b = static_cast<float*>(alloc(size_t(l.N) * 4));
      fill_random_bf16(w, size_t(l.N) * l.K, 300 + i, 0.f, 0.02f, s);
      fill_random_f32(b, l.N, 400 + i, 0.f, 0.1f, s);
      // As the model runs them: bf16 bias values (qkv's bf16 store takes them in the GEMM).
      round_f32_to_bf16_values(b, l.N, s);
      if (blas && l.mode == Epilogue::kStoreBF16) blas->prepare_bf16_bias(b, l.N, s);
      ws.push_back(WeightMat{WeightMat::kBF16, w, nullptr, l.bias ? b : nullptr, l.N, l.K});
    }
    auto* a = static_cast<bf16_t*>(alloc(size_t(M) * l.K * 2));
    fill_random_bf16(a, size_t(M) * l.K, 500, 0.f, 1.f, s);
    const bool bf16_out = l.mode == Epilogue::kStoreBF16;
    const size_t out_bytes = size_t(M) * l.N * (bf16_out ? 2 : 4);
    void* out[2] = {alloc(out_bytes), alloc(out_bytes)};
    const double flop = 2.0 * M * l.N * l.K;
    std::vector<float> ref;
    for (int path : {0, 1}) {  // 0: our GEMM, 1: cuBLASLt
      if (path == 1 && !blas) break;
      set_linear_path(path == 0 ? 2 : 0);
      CublasLtGemm* g = path == 1 ? blas.get() : nullptr;
      const LinearKernel k = choose_linear_kernel(
          {WeightMat::kBF16, M, M, l.N, l.K, false, path == 0 ? 2 : 0, false,
           g && CublasLtGemm::supports(ws[0], l.K, Epilogue{l.mode, out[path], l.N})});
      // cuBLASLt directly (linear() may keep decode sizes off it: cublas_min_rows).
      auto call = [&](int i) {
        if (g)
          g->run(ws[i % copies], a, l.K, M, Epilogue{l.mode, out[path], l.N}, s);
        else
          linear(ws[i % copies], a, l.K, M, Epilogue{l.mode, out[path], l.N}, s);
      };
      // One call from zeros for the comparison, then the timing (a residual add keeps adding).
      GPTOSS_CUDA_CHECK(cudaMemsetAsync(out[path], 0, out_bytes, s));
      if (g && !g->run(ws[0], a, l.K, M, Epilogue{l.mode, out[path], l.N}, s)) {
        std::printf("| %s | %dx%dx%d | %s | cublaslt declined (no algorithm): linear() runs gemm_mma | | | |\n",
                    l.name, M, l.N, l.K, l.epi);
        break;
      }
      if (!g) call(0);
      GPTOSS_CUDA_CHECK(cudaStreamSynchronize(s));
      std::vector<float> got = download(out[path], size_t(M) * l.N, bf16_out);
      std::string diff = "-";
      if (path == 0) {
        ref = got;
      } else {
        double num = 0, den = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
          den += double(ref[i]) * ref[i];
        }
        char b[32];
        std::snprintf(b, sizeof b, "%.2e", std::sqrt(num / std::max(den, 1e-30)));
        diff = b;
      }
      const double us = mean_us(ev, s, iters, call);
      std::printf("| %s | %dx%dx%d | %s | %s | %.2f | %.0f | %s |\n", l.name, M, l.N, l.K, l.epi,
                  linear_kernel_name(k), us, flop / us / 1e6, diff.c_str());
      std::fflush(stdout);
    }
    set_linear_path(0);
  }
  if (lib && M <= 64) {
    std::printf("\nThe same layers' GEMMs in fp8 (e4m3 weights and activations, a scale a row and a token), "
                "weight bytes over time\n\n| layer | MxNxK | output | kernel | us/launch | TB/s |\n|---|---|---|---|---|---|\n");
    bench_fp8_outer_vec(*lib, M, QKV, c.hidden, "qkv", false, iters, ev, s);
    bench_fp8_outer_vec(*lib, M, c.hidden, c.q_dim(), "o_proj", true, iters, ev, s);
    bench_fp8_outer_vec(*lib, M, c.vocab, c.hidden, "lm_head", true, iters, ev, s);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  cudaStreamDestroy(s);
}

}  // namespace gptoss::cuda
