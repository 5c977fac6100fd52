#pragma once
// What the kernel tests (test_cuda_*.cpp of test_cuda_kernels) share: the fixture that puts every
// kernel choice back after a test, and the fp8 weights the dense and router tests compare with.
#include <vector>

#include "backend/cuda/kernels.h"
#include "common/dtype.h"
#include "cuda_test_util.h"

namespace gptoss::test {

// One fixture type for the whole "Kernels" suite (googletest requires it across files).
class Kernels : public CudaTest {
 protected:
  void TearDown() override {
    cuda::set_linear_path(0);
    cuda::set_gemv_variant(0);
    cuda::set_expert_gemm_version(0);
    cuda::set_decode_kernel_choice(-1);  // back to GPTOSS_DECODE_KERNEL's choice
    cuda::set_router_variant(0);
    cuda::set_combine_variant(0);
  }
};

// The bf16 weights an fp8 decode copy holds in effect: each rounded to e4m3 at its row's scale.
inline std::vector<uint16_t> fp8_effective(const std::vector<uint16_t>& wb, const std::vector<float>& rs, int N,
                                           int K) {
  std::vector<uint16_t> weff = wb;
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) {
      float w = bf16_to_f32(wb[size_t(n) * K + k]);
      float q = fp8_e4m3_to_f32(f32_to_fp8_e4m3(w * (1.f / rs[n]))) * rs[n];
      weff[size_t(n) * K + k] = f32_to_bf16(q);  // q * rs is not always a bf16; the bounds cover it
    }
  return weff;
}

}  // namespace gptoss::test
