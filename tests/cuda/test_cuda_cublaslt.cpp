// Dense GEMMs through cuBLASLt (backend/cuda/cublaslt_gemm.h): the loader and the kernel
// choice without a GPU (what happens when the library is absent, or the mode keeps our own
// kernels), and the GEMM itself against the CPU reference at gpt-oss shapes (qkv 5120x2880,
// o_proj 2880x4096, router 128x2880) and awkward ones, every epilogue prefill uses, with and
// without bias, the residual add onto a nonzero output.
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cublaslt_gemm.h"
#include "backend/cuda/cublaslt_library.h"
#include "backend/cuda/kernels.h"
#include "cuda_test_util.h"

namespace gptoss {
namespace {

using namespace gptoss::test;
using cuda::Epilogue;
using cuda::LinearKernel;
using cuda::LinearProblem;
using cuda::WeightMat;

// ---- no GPU needed ----

LinearProblem dense(WeightMat::Format fmt, int M, int N, int K, bool cublas) {
  return LinearProblem{fmt, M, M, N, K, false, 0, false, cublas};
}

TEST(DenseGemmChoice, CublasForBf16FromMinRowsWhenOffered) {
  const int min_rows = cuda::cublas_min_rows();
  if (!std::getenv("GPTOSS_CUBLAS_MIN_ROWS")) { EXPECT_EQ(min_rows, 17); }
  EXPECT_EQ(cuda::choose_linear_kernel(dense(WeightMat::kBF16, 65, 5120, 2880, true)), LinearKernel::kCublasLt);
  EXPECT_EQ(cuda::choose_linear_kernel(dense(WeightMat::kBF16, 4096, 128, 2880, true)), LinearKernel::kCublasLt);
  // Decode passes from min_rows tokens take it too (the skinny kernels pass over the weights once
  // per 32 tokens); smaller ones keep our kernels.
  for (int M : {17, 33, 64})
    EXPECT_EQ(cuda::choose_linear_kernel(dense(WeightMat::kBF16, M, 5120, 2880, true)) == LinearKernel::kCublasLt,
              M >= min_rows)
        << "M=" << M;
  EXPECT_NE(cuda::choose_linear_kernel(dense(WeightMat::kBF16, min_rows - 1, 5120, 2880, true)), LinearKernel::kCublasLt);
  EXPECT_NE(cuda::choose_linear_kernel(dense(WeightMat::kBF16, 1, 5120, 2880, true)), LinearKernel::kCublasLt);
  // Not offered (library absent, --dense-gemm own, an epilogue it does not take): our GEMM.
  EXPECT_EQ(cuda::choose_linear_kernel(dense(WeightMat::kBF16, 2048, 5120, 2880, false)), LinearKernel::kGemmMma);
  // Batch-invariant mode, a forced path, other formats, grouped problems: never.
  LinearProblem inv = dense(WeightMat::kBF16, 2048, 128, 2880, true);
  inv.invariant = true;
  EXPECT_EQ(cuda::choose_linear_kernel(inv), LinearKernel::kGemvBf16);
  LinearProblem forced = dense(WeightMat::kBF16, 2048, 5120, 2880, true);
  forced.force_path = 2;
  EXPECT_EQ(cuda::choose_linear_kernel(forced), LinearKernel::kGemmMma);
  EXPECT_EQ(cuda::choose_linear_kernel(dense(WeightMat::kMXFP4, 2048, 5120, 2880, true)), LinearKernel::kGemmMma);
  EXPECT_EQ(cuda::choose_linear_kernel(dense(WeightMat::kFragBF16, 2048, 5120, 2880, true)), LinearKernel::kNone);
  LinearProblem grouped{WeightMat::kMXFP4, 8192, 2048, 5760, 2880, true, 0, false, true};
  EXPECT_NE(cuda::choose_linear_kernel(grouped), LinearKernel::kCublasLt);
  EXPECT_STREQ(cuda::linear_kernel_name(LinearKernel::kCublasLt), "cublaslt");
}

TEST(DenseGemmChoice, SupportsOnlyWhatItDoesExactly) {
  const WeightMat W{WeightMat::kBF16, nullptr, nullptr, nullptr, 5120, 2880};
  EXPECT_TRUE(cuda::CublasLtGemm::supports(W, 2880, Epilogue{Epilogue::kStoreBF16, nullptr, 5120}));
  EXPECT_TRUE(cuda::CublasLtGemm::supports(W, 2880, Epilogue{Epilogue::kStoreF32, nullptr, 5120}));
  EXPECT_TRUE(cuda::CublasLtGemm::supports(W, 2880, Epilogue{Epilogue::kAddF32, nullptr, 5120}));
  EXPECT_FALSE(cuda::CublasLtGemm::supports(W, 2880, Epilogue{Epilogue::kSwiGLU, nullptr, 2560}));
  EXPECT_FALSE(cuda::CublasLtGemm::supports(W, 2880, Epilogue{Epilogue::kScatterAdd, nullptr, 5120}));
  Epilogue f16{Epilogue::kStoreBF16, nullptr, 5120};
  f16.out_f16 = true;
  EXPECT_FALSE(cuda::CublasLtGemm::supports(W, 2880, f16));
  EXPECT_FALSE(cuda::CublasLtGemm::supports(W, 2884, Epilogue{Epilogue::kStoreBF16, nullptr, 5120}));  // unaligned rows
  EXPECT_FALSE(cuda::CublasLtGemm::supports(W, 2880, Epilogue{Epilogue::kStoreBF16, nullptr, 5124}));
  EXPECT_FALSE(cuda::CublasLtGemm::supports(W, 2880, Epilogue{Epilogue::kStoreBF16, nullptr, 4096}));  // ldo < N
  const WeightMat mx{WeightMat::kMXFP4, nullptr, nullptr, nullptr, 5120, 2880};
  EXPECT_FALSE(cuda::CublasLtGemm::supports(mx, 2880, Epilogue{Epilogue::kStoreBF16, nullptr, 5120}));
}

TEST(DenseGemmChoice, LoaderSaysWhyAndWhereToLook) {
  try {
    cuda::load_cublaslt({"/nonexistent/libcublasLt.so.13"});
    FAIL() << "loaded a file that does not exist";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("/nonexistent/libcublasLt.so.13"), std::string::npos) << m;
    EXPECT_NE(m.find("GPTOSS_CUBLASLT"), std::string::npos) << m;
  }
  // A library that opens but is not cuBLASLt.
  try {
    cuda::load_cublaslt({"libc.so.6"});
    FAIL() << "took libc for cuBLASLt";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lacks cublasLt"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cuda::load_cublaslt({}), Error);
}

TEST(DenseGemmChoice, LoaderBindsTheToolkitsLibraryWhenPresent) {
  const char* saved = std::getenv("GPTOSS_CUBLASLT");
  const std::string keep = saved ? saved : "";
  setenv("GPTOSS_CUBLASLT", "/some/where/libcublasLt.so.13", 1);
  EXPECT_EQ(cuda::cublaslt_candidates(), std::vector<std::string>{"/some/where/libcublasLt.so.13"});
  unsetenv("GPTOSS_CUBLASLT");
  const auto plain = cuda::cublaslt_candidates();
  ASSERT_EQ(plain.size(), 2u);
  EXPECT_EQ(plain[0], "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR));
  if (saved) setenv("GPTOSS_CUBLASLT", keep.c_str(), 1);
  cuda::CublasLtLibrary lib;
  try {
    lib = cuda::load_cublaslt(plain);
  } catch (const Error& e) {
    GTEST_SKIP() << "no cuBLASLt on this machine: " << e.what();
  }
  EXPECT_EQ(lib.version / 10000, size_t(CUBLAS_VER_MAJOR));
  EXPECT_NE(lib.path.find("libcublasLt.so"), std::string::npos) << lib.path;
  EXPECT_NE(lib.Matmul, nullptr);
  EXPECT_NE(lib.MatmulAlgoGetHeuristic, nullptr);
}

const cuda::CublasLtLibrary* no_library(std::string* why) {
  *why = "not installed (test)";
  return nullptr;
}

TEST(DenseGemmChoice, ModesAndAnAbsentLibraryKeepOurKernels) {
  const char* saved = std::getenv("GPTOSS_DENSE_GEMM");
  const std::string keep = saved ? saved : "";
  unsetenv("GPTOSS_DENSE_GEMM");
  // Library absent: no cuBLASLt GEMM (linear() then gets none and chooses our GEMM), whether
  // asked for or not; none of these touch a GPU.
  EXPECT_EQ(cuda::make_dense_gemm("auto", false, no_library), nullptr);
  EXPECT_EQ(cuda::make_dense_gemm("cublas", false, no_library), nullptr);
  EXPECT_EQ(cuda::make_dense_gemm("own", false), nullptr);
  EXPECT_EQ(cuda::make_dense_gemm("auto", true), nullptr);  // batch-invariant
  EXPECT_EQ(cuda::make_dense_gemm("cublas", true), nullptr);
  EXPECT_THROW(cuda::make_dense_gemm("cutlass", false), Error);
  setenv("GPTOSS_DENSE_GEMM", "own", 1);
  EXPECT_EQ(cuda::make_dense_gemm("auto", false), nullptr);
  setenv("GPTOSS_DENSE_GEMM", "fast", 1);
  EXPECT_THROW(cuda::make_dense_gemm("auto", false), Error);
  EXPECT_EQ(cuda::make_dense_gemm("own", false), nullptr);  // an explicit choice wins over the variable
  if (saved)
    setenv("GPTOSS_DENSE_GEMM", keep.c_str(), 1);
  else
    unsetenv("GPTOSS_DENSE_GEMM");
}

// ---- on the GPU ----

class CublasLt : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    std::string why;
    const cuda::CublasLtLibrary* lib = cuda::cublaslt(&why);
    if (!lib) GTEST_SKIP() << why;
    gemm = std::make_unique<cuda::CublasLtGemm>(*lib);
  }
  std::unique_ptr<cuda::CublasLtGemm> gemm;
};

struct Case {
  int M, N, K;
};

// Every epilogue of one problem, through CublasLtGemm::run (which must take it) and through
// linear() (which must choose it), against the CPU on every `stride`-th row.
void check_case(cuda::CublasLtGemm& g, const Case& c, bool with_bias) {
  FastRng r(fresh_seed());
  auto x = round_bf16(rand_f32(size_t(c.M) * c.K, r));
  auto wb = to_bf16(rand_f32(size_t(c.N) * c.K, r, 0.02f));
  auto bias = rand_f32(c.N, r, 0.1f);
  const int stride = c.M > 256 ? 7 : 1;  // the CPU reference on a sample of the big cases' rows
  std::vector<int> rows;
  for (int i = 0; i < c.M; i += stride) rows.push_back(i);
  if (rows.back() != c.M - 1) rows.push_back(c.M - 1);
  std::vector<float> xs;
  for (int i : rows) xs.insert(xs.end(), x.begin() + size_t(i) * c.K, x.begin() + size_t(i + 1) * c.K);
  std::vector<float> ref(rows.size() * c.N);
  cpu::linear_bf16(xs.data(), int(rows.size()), c.K, wb.data(), c.N, with_bias ? bias.data() : nullptr, ref.data());
  auto sample = [&](const std::vector<float>& full) {
    std::vector<float> s;
    for (int i : rows) s.insert(s.end(), full.begin() + size_t(i) * c.N, full.begin() + size_t(i + 1) * c.N);
    return s;
  };
  Dev<uint16_t> dx(to_bf16(x)), dw(wb);
  Dev<float> db(bias), dy(size_t(c.M) * c.N);
  Dev<uint16_t> dyb(size_t(c.M) * c.N);
  const WeightMat W{WeightMat::kBF16, dw.p(), nullptr, with_bias ? db.p() : nullptr, c.N, c.K};
  const std::string what = "M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
                           (with_bias ? " bias" : " no bias");
  for (bool via_linear : {false, true}) {
    auto run = [&](const Epilogue& e) {
      if (via_linear) {
        ASSERT_EQ(cuda::choose_linear_kernel({WeightMat::kBF16, c.M, c.M, c.N, c.K, false, 0, false,
                                              cuda::CublasLtGemm::supports(W, c.K, e)}),
                  LinearKernel::kCublasLt);
        cuda::linear(W, dx.p(), c.K, c.M, e, 0, false, &g);
      } else {
        ASSERT_TRUE(g.run(W, dx.p(), c.K, c.M, e, 0)) << "cuBLASLt declined " << what << " mode " << int(e.mode);
      }
    };
    const std::string how = what + (via_linear ? " (linear)" : " (run)");
    dy.poison();
    run(Epilogue{Epilogue::kStoreF32, dy.p(), c.N});
    EXPECT_LE(rel_err(sample(dy.download()), ref), 2e-3) << "f32, " << how;
    dyb.poison();
    run(Epilogue{Epilogue::kStoreBF16, dyb.p(), c.N});
    EXPECT_LE(rel_err(sample(from_bf16(dyb.download())), ref), 6e-3) << "bf16, " << how;
    // The residual add onto a nonzero output (o_proj into the residual stream).
    auto res = rand_f32(size_t(c.M) * c.N, r);
    dy.upload(res);
    run(Epilogue{Epilogue::kAddF32, dy.p(), c.N});
    auto ref2 = ref;
    auto res_s = sample(res);
    for (size_t i = 0; i < ref2.size(); ++i) ref2[i] += res_s[i];
    EXPECT_LE(rel_err(sample(dy.download()), ref2), 2e-3) << "add, " << how;
  }
}

TEST_F(CublasLt, RealShapesAgainstCpu) {
  std::vector<Case> cases = {{65, 5120, 2880}, {129, 5120, 2880}, {2048, 5120, 2880}, {65, 2880, 4096},
                             {129, 2880, 4096}, {2048, 2880, 4096}, {2048, 128, 2880}};
  if (small_mode()) cases = {{65, 128, 64}, {129, 64, 128}};
  for (const Case& c : cases) check_case(*gemm, c, true);
}

TEST_F(CublasLt, AwkwardShapesAgainstCpu) {
  for (const Case& c : {Case{67, 48, 128}, Case{65, 8, 32}, Case{300, 136, 96}, Case{1000, 5120, 96}})
    for (bool bias : {true, false}) check_case(*gemm, c, bias);
}

// The staged bf16 store (f32 rows, then rounded), which serves when cuBLASLt has no bf16-output
// algorithm with an f32 bias.
TEST_F(CublasLt, StagedBf16StoreAgainstCpu) {
  cuda::CublasLtGemm::set_force_staging(true);
  cuda::CublasLtGemm staged(gemm->library());  // plans made while forced
  for (const Case& c : {Case{129, 5120, 2880}, Case{67, 48, 128}, Case{2048, 5120, 2880}}) check_case(staged, c, true);
  cuda::CublasLtGemm::set_force_staging(false);
}

// Rows of a strided A and a wider output (ld > N), as a tensor-parallel slice or a sub-matrix.
TEST_F(CublasLt, StridedRowsAgainstCpu) {
  const int M = 97, N = 200, K = 64, lda = 96, ldo = 208;
  FastRng r(fresh_seed());
  auto x = round_bf16(rand_f32(size_t(M) * lda, r));
  auto wb = to_bf16(rand_f32(size_t(N) * K, r, 0.05f));
  auto bias = rand_f32(N, r, 0.1f);
  std::vector<float> xk;
  for (int i = 0; i < M; ++i) xk.insert(xk.end(), x.begin() + size_t(i) * lda, x.begin() + size_t(i) * lda + K);
  std::vector<float> ref(size_t(M) * N);
  cpu::linear_bf16(xk.data(), M, K, wb.data(), N, bias.data(), ref.data());
  Dev<uint16_t> dx(to_bf16(x)), dw(wb);
  Dev<float> db(bias), dy(size_t(M) * ldo);
  const WeightMat W{WeightMat::kBF16, dw.p(), nullptr, db.p(), N, K};
  ASSERT_TRUE(gemm->run(W, dx.p(), lda, M, Epilogue{Epilogue::kStoreF32, dy.p(), ldo}, 0));
  auto y = dy.download();
  std::vector<float> got;
  for (int i = 0; i < M; ++i) got.insert(got.end(), y.begin() + size_t(i) * ldo, y.begin() + size_t(i) * ldo + N);
  EXPECT_LE(rel_err(got, ref), 2e-3);
  // The gap columns past N keep the poison: nothing written outside the rows' N outputs.
  for (int i = 0; i < M; ++i)
    for (int n = N; n < ldo; ++n) ASSERT_TRUE(std::isnan(y[size_t(i) * ldo + n])) << i << "," << n;
}

// Once a problem's plan exists, the GEMM captures into a CUDA graph (no allocation, no sync) and
// the replay gives the eager bits.
TEST_F(CublasLt, CapturesIntoAGraph) {
  const int M = 130, N = 5120, K = 2880;
  FastRng r(fresh_seed());
  Dev<uint16_t> dx(to_bf16(round_bf16(rand_f32(size_t(M) * K, r)))), dw(to_bf16(rand_f32(size_t(N) * K, r, 0.02f)));
  Dev<float> db(rand_f32(N, r, 0.1f));
  Dev<uint16_t> eager(size_t(M) * N), replay(size_t(M) * N);
  const WeightMat W{WeightMat::kBF16, dw.p(), nullptr, db.p(), N, K};
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_TRUE(gemm->run(W, dx.p(), K, M, Epilogue{Epilogue::kStoreBF16, eager.p(), N}, s));
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const bool ran = gemm->run(W, dx.p(), K, M, Epilogue{Epilogue::kStoreBF16, replay.p(), N}, s);
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  ASSERT_TRUE(ran);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(replay.download(), eager.download());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

// linear() with a cuBLASLt GEMM at hand: below cublas_min_rows() rows, and in batch-invariant
// mode, the same bits as without it (our kernels); from there on the bits of cuBLASLt itself.
TEST_F(CublasLt, LinearUsesItFromMinRows) {
  const int N = 640, K = 2880;
  FastRng r(fresh_seed());
  auto wb = to_bf16(rand_f32(size_t(N) * K, r, 0.02f));
  auto bias = rand_f32(N, r, 0.1f);
  Dev<uint16_t> dw(wb);
  Dev<float> db(bias);
  const WeightMat W{WeightMat::kBF16, dw.p(), nullptr, db.p(), N, K};
  const int min_rows = cuda::cublas_min_rows();
  for (int M : {1, min_rows - 1, min_rows, 33, 64, 65, 200}) {
    Dev<uint16_t> dx(to_bf16(round_bf16(rand_f32(size_t(M) * K, r))));
    Dev<float> a(size_t(M) * N), b(size_t(M) * N), c(size_t(M) * N), d(size_t(M) * N);
    cuda::linear(W, dx.p(), K, M, Epilogue{Epilogue::kStoreF32, a.p(), N}, 0, false, gemm.get());
    cuda::linear(W, dx.p(), K, M, Epilogue{Epilogue::kStoreF32, b.p(), N}, 0, false, nullptr);
    ASSERT_TRUE(gemm->run(W, dx.p(), K, M, Epilogue{Epilogue::kStoreF32, c.p(), N}, 0));
    const auto ha = a.download(), hb = b.download(), hc = c.download();
    EXPECT_EQ(ha, M >= min_rows ? hc : hb) << "M=" << M;
    if (M >= min_rows) {
      EXPECT_LE(rel_err(ha, hb), 2e-3) << "M=" << M;  // the two agree closely
    }
  }
  // The router in batch-invariant mode (N <= 512: the K-split GEMV) at a prefill size.
  const WeightMat R{WeightMat::kBF16, dw.p(), nullptr, db.p(), 128, K};
  const int M = 300;
  Dev<uint16_t> dx(to_bf16(round_bf16(rand_f32(size_t(M) * K, r))));
  Dev<float> a(size_t(M) * 128), b(size_t(M) * 128);
  cuda::linear(R, dx.p(), K, M, Epilogue{Epilogue::kStoreF32, a.p(), 128}, 0, true, gemm.get());
  cuda::linear(R, dx.p(), K, M, Epilogue{Epilogue::kStoreF32, b.p(), 128}, 0, true, nullptr);
  EXPECT_EQ(a.download(), b.download());
}

}  // namespace
}  // namespace gptoss
