#pragma once
// What the linear layers' own CUDA kernels share: their arguments (LinArgs), the e2m1 and e8m0
// arithmetic, the epilogue stores, the fused RMSNorm's inputs, and the launchers linear.cu (the
// kernel choice and the entry points of kernels.h) calls: gemv.cu (bf16 and MXFP4 GEMV, decode
// sizes) and gemm_mma.cu (mma.sync GEMM, larger M).
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"

namespace gptoss::cuda::linear_impl {

struct LinArgs {
  WeightMat W;
  const uint16_t* A;
  int lda;
  int M;  // dense rows
  bool grouped, gather_a;
  MoeRouting r;
  Epilogue epi;
};

// The GEMV kernels' rows: in a grouped launch, grid row blockIdx.y is a group, its sorted rows
// [row_begin, row_end) and its expert (false past the routing's groups: the block has nothing to
// do); dense, every row and expert 0.
__device__ __forceinline__ bool gemv_block_rows(const LinArgs& a, int& row_begin, int& row_end, int& expert) {
  row_begin = 0, row_end = a.M, expert = 0;
  if (!a.grouped) return true;
  const int g = blockIdx.y;
  if (g >= a.r.counts[0]) return false;
  row_begin = a.r.group_start[g];
  row_end = a.r.group_end[g];
  expert = a.r.group_expert[g];
  return true;
}

// e2m1 nibble -> float carrying a 2^-126 factor: the 3 magnitude bits land on the exponent's
// two low bits and the mantissa's top bit, which maps the subnormal code (0.5) right as well.
__device__ __forceinline__ float e2m1_bits(uint32_t nib) {
  return __uint_as_float(((nib & 7u) << 22) | ((nib & 8u) << 28));
}
// The scale 2^(s-127) times the 2^126 the nibble trick leaves out, as two factors (hi * lo) so
// that every e8m0 byte stays finite: hi = 2^(min(s,128)-1), lo = 2^(max(s,128)-128).
__device__ __forceinline__ float mx_scale_hi(uint32_t s) { return __uint_as_float((min(s, 128u) + 126u) << 23); }
__device__ __forceinline__ float mx_scale_lo(uint32_t s) { return __uint_as_float((max(s, 128u) - 1u) << 23); }

__device__ __forceinline__ float swiglu_dev(float gate, float up, float limit) {
  float g = fminf(gate, limit);
  float u = fmaxf(fminf(up, limit), -limit);
  return g / (1.f + __expf(-1.702f * g)) * (u + 1.f);
}

// Applies the epilogue to one value (not SwiGLU).
__device__ __forceinline__ void epi_store(const LinArgs& a, int row, int n, float v) {
  const Epilogue& e = a.epi;
  switch (e.mode) {
    case Epilogue::kStoreF32: static_cast<float*>(e.out)[size_t(row) * e.ldo + n] = v; break;
    case Epilogue::kStoreBF16: static_cast<uint16_t*>(e.out)[size_t(row) * e.ldo + n] = f32_to_bf16_bits(v); break;
    case Epilogue::kAddF32: static_cast<float*>(e.out)[size_t(row) * e.ldo + n] += v; break;
    case Epilogue::kScatterAdd:
      atomicAdd(static_cast<float*>(e.out) + size_t(a.r.pair_token[row]) * e.ldo + n, a.r.pair_weight[row] * v);
      break;
    default: break;
  }
}
__device__ __forceinline__ void epi_swiglu(const LinArgs& a, int row, int n_even, float gate, float up) {
  static_cast<uint16_t*>(a.epi.out)[size_t(row) * a.epi.ldo + n_even / 2] =
      f32_to_bf16_bits(swiglu_dev(gate, up, a.epi.swiglu_limit));
}

constexpr int kGemvMaxM = 8;  // the auto path uses GEMV up to this many rows (per group)

// RMSNorm fused into a bf16 GEMV (decode): A is the f32 residual stream, normalized on the fly,
// so the normalized rows never make a round trip through memory and the norm costs no launch.
struct FusedNorm {
  const float* x = nullptr;  // [M, K] f32; null: A is the (already normalized) bf16 input
  const float* w = nullptr;  // [K]
  float eps = 1e-5f;
  uint16_t* xn_out = nullptr;  // optional: block 0 also stores the normalized rows (bf16 [M, K])
  bool xn_f16 = false;         // ... as fp16 instead (the skinny MXFP4 kernels' activation type)
};

// 32-element chunks a lane holds per row: 3 cover the experts' K (2880); 4 cover o_proj's 4096
// when the dense layers are MXFP4 too (--mxfp4-layers).
constexpr int kMxMaxK = 4096;

// The GEMV kernels for `a` (gemv.cu): grid_y groups (grouped launches), the fused norm when fn.x
// is set; variant 1 takes the first bf16 GEMV (row pairs) where the wide one would run (A/B runs).
void launch_gemv(const LinArgs& a, int grid_y, cudaStream_t s, const FusedNorm& fn, int variant);
// The mma.sync GEMM for `a` (gemm_mma.cu): grid_y row tiles of kGemmBM rows.
void launch_gemm_mma(const LinArgs& a, int grid_y, cudaStream_t s);

}  // namespace gptoss::cuda::linear_impl
